#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/infer: airs-generate (src/infer) in one run, side by side:
#   1. time to first token of a second process whose ~512-token system
#      prompt is cached in the daemon's blocks, against the same prompt cold;
#   2. decode tokens/s against llama.cpp (llama-gen, prebuilt from npm) on
#      the same model and thread count (1 and all cores), and against the
#      memory-bandwidth limit: model bytes per token / read bandwidth of the
#      mapped weights (read_bw);
#   3. KV bytes of 4 sessions sharing a ~200-token prompt, against 4 private
#      copies.
#
#   bench/infer/bench_infer.sh --build BUILD_DIR [--size 200M] [--types q8_0] [--work DIR] [--reps 3]
# (--reps: decode runs per engine and thread count; the best is reported)
# Needs root (huge pages) and a built tests/llama/work (runs setup.sh if not).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build="" size=200M types=q8_0 work="" reps=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR [--size 200M] [--types q8_0] [--work DIR] [--reps 3]" >&2; exit 2 ;;
  esac
done
[[ -n $build ]] || { echo "bench_infer: --build BUILD_DIR is required" >&2; exit 2; }
build=$(cd "$build" && pwd)
work=${work:-$build/bench/infer/work}
mkdir -p "$work"
llama_work=$build/tests/llama/work
[[ -x $llama_work/llama-gen ]] || sh "$src/tests/llama/setup.sh" "$src/tests/llama" "$llama_work" "${CC:-cc}"
gen=$build/src/infer/airs-generate
mk=$build/src/gguf/airs-mkmodel
memd=$build/daemon/airs-memd
bw=$build/bench/infer/read_bw
for f in "$gen" "$mk" "$memd" "$bw" "$llama_work/llama-gen"; do
  [[ -x $f ]] || { echo "bench_infer: $f missing (build it)" >&2; exit 1; }
done
model=$work/infer-$types-$size.gguf
[[ -f $model ]] || "$mk" --llama --types "$types" --out "$model" --size "$size" --seed 42 >/dev/null
model_bytes=$(stat -c %s "$model")
pool_bytes=$(( (model_bytes / 1048576 + 128) * 1048576 ))
jq_() { python3 -c "import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); print($1)"; }

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -f $work/dbus.pid ]] && kill "$(cat "$work/dbus.pid")" 2>/dev/null || true
}
trap cleanup EXIT
dbus-daemon --config-file="$src/tests/support/test-bus.conf" --print-address=3 --print-pid=4 --fork \
  3>"$work/bus.addr" 4>"$work/dbus.pid" 2>/dev/null
bus=$(head -1 "$work/bus.addr")
# A fixed arena size (it must not follow the pool's free bytes between
# sessions) and a pressure loop that stays out of the measurements on a
# busy machine. A fresh state directory of its own: the default one
# (/var/lib/airs) is every daemon's on the machine, and its KV spill tier
# kept the system prompt of an earlier run of the same model, so the
# "cold" run matched it (416 of 418 tokens) and measured nothing.
rm -rf "$work/state"
printf '[daemon]\nstate_dir = "%s"\n[pool]\nprofile = "custom"\nsize = "%d"\n[kv]\nmax_arena_bytes = 67108864\n[pressure]\nresize_pool = false\nsome_threshold = "1900ms"\nfull_threshold = "1900ms"\n' "$work/state" "$pool_bytes" >"$work/memd.conf"
"$memd" --config "$work/memd.conf" --bus "$bus" >"$work/memd.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do grep -q "serving org.aios.Airs1" "$work/memd.log" && break; sleep 0.05; done

words() { local n=$1 out=""; local w=(the quick brown fox jumps over a lazy dog and runs far away into deep forest); \
  for ((i = 0; i < n; i++)); do out+="${w[i % ${#w[@]}]} "; done; printf '%s' "$out"; }

echo "== 1. time to first token: cached ~512-token system prompt vs cold (1 thread)"
words 150 >"$work/sys512.txt"
# Warm the model into the pool and page cache first (not part of either number).
"$gen" "$model" -p "warm" -n 1 --bus "$bus" --json --threads 1 >/dev/null
cold=$("$gen" "$model" --system "$work/sys512.txt" -p "what is the river" -n 4 --bus "$bus" --json --threads 1)
hot=$("$gen" "$model" --system "$work/sys512.txt" -p "tell me about the mountain" -n 4 --bus "$bus" --json --threads 1)
c_ms=$(echo "$cold" | jq_ 'j["ttft_ms"]'); h_ms=$(echo "$hot" | jq_ 'j["ttft_ms"]')
echo "prompt tokens $(echo "$cold" | jq_ 'j["prompt_tokens"]'), matched cold $(echo "$cold" | jq_ 'j["matched_tokens"]'), hot $(echo "$hot" | jq_ 'j["matched_tokens"]')"
[[ $(echo "$cold" | jq_ 'j["matched_tokens"]') == 0 ]] || echo "bench_infer: the cold run matched cached blocks: its ttft is not a cold prefill" >&2
python3 -c "print(f'cold ttft {float($c_ms):.1f} ms, cached ttft {float($h_ms):.1f} ms, ratio {float($h_ms)/float($c_ms):.3f} (target <= 0.1)')"

echo "== 2. decode tokens/s vs llama.cpp (same model, same threads) and vs the memory-bandwidth limit"
# llama.cpp twice: its default copies Q4_0/Q8_0 weights into private,
# repacked buffers on this CPU (not possible for a reader of the shared
# mapping); --no-repack reads the mapping in place as airs-generate does.
read_gbs=$("$bw" "$model" | awk '/read_gb_s/ {print $2}')
ll_tok_s() { "$llama_work/llama-gen" --backends "$llama_work/bins" --model "$model" --n 64 --threads "$1" \
    --text "the quick brown fox" "${@:2}" | awk '/first_token_ms/ {f=$2} /total_ms/ {t=$2} END {printf "%.3f", 63 / ((t - f) / 1000)}'; }
limit=$(python3 -c "print(float($read_gbs) * 1e9 / $model_bytes)")
python3 -c "print(f'memory-bandwidth limit: {float($read_gbs):.1f} GB/s read of the mapped weights / {$model_bytes/1e6:.0f} MB per token = {float($limit):.1f} tok/s')"
printf '%-8s %12s %12s %12s %12s %10s %12s %10s\n' threads airs_tok_s airs_pool llama llama_norep ratio ratio_norep of_limit
# Each column is the best of --reps runs, the four engines taking turns: on
# a shared machine one run of each, seconds apart, measured the other
# processes' load more than the engines (ratios moved 2-4x between runs).
max_() { python3 -c "print(max(float('$1' or 0), float('$2' or 0)))"; }
for t in 1 $(nproc); do
  ours=0 pool=0 ll=0 llnr=0
  for ((r = 0; r < reps; r++)); do
    ours=$(max_ "$ours" "$("$gen" "$model" -p "the quick brown fox" -n 64 --no-daemon --json --threads "$t" 2>/dev/null | jq_ 'j["decode_tok_s"]')")
    pool=$(max_ "$pool" "$("$gen" "$model" -p "the quick brown fox" -n 64 --bus "$bus" --json --threads "$t" 2>/dev/null | jq_ 'j["decode_tok_s"]')")
    ll=$(max_ "$ll" "$(ll_tok_s "$t")")
    llnr=$(max_ "$llnr" "$(ll_tok_s "$t" --no-repack)")
  done
  python3 -c "print(f'{$t:<8} {float($ours):12.1f} {float($pool):12.1f} {float($ll):12.1f} {float($llnr):12.1f} {float($ours)/float($ll):10.2f} {float($ours)/float($llnr):12.2f} {float($ours)/float($limit):10.2f}')"
done
echo "(best of $reps runs each; targets: ratio >= 0.8 at each thread count; of_limit >= 0.7 on the larger model)"

echo "== 3. KV bytes: 4 sessions sharing a ~200-token prompt vs 4 private copies"
words 60 >"$work/sys200.txt"
fds=()
for i in 1 2 3 4; do
  rm -f "$work/hold$i" "$work/out$i"; mkfifo "$work/hold$i"
  "$gen" "$model" --system "$work/sys200.txt" -p "question number $i" -n 8 --bus "$bus" --json --threads 1 --hold \
    <"$work/hold$i" >"$work/out$i" &
  pids+=($!)
  exec {fd}>"$work/hold$i"
  fds+=("$fd")
  for _ in $(seq 600); do [[ -s $work/out$i ]] && break; sleep 0.05; done
done
outs=()
for i in 1 2 3 4; do outs+=("$(tail -1 "$work/out$i")"); done
printf '%s\n' "${outs[@]}" | python3 -c "
import json, sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]
bb = runs[0]['kv_block_bytes']
shared = len({b for r in runs for b in r['kv_blocks']}) * bb
private = sum(len(r['kv_blocks']) for r in runs) * bb
one = len(runs[0]['kv_blocks']) * bb
print(f'matched tokens per session: {[r[\"matched_tokens\"] for r in runs]}')
print(f'shared: {shared} bytes in distinct blocks; 4 private copies: {private} bytes; one session: {one} bytes; ratio {shared/private:.2f}')"
for fd in "${fds[@]}"; do exec {fd}>&-; done
wait "${pids[@]:1}" 2>/dev/null || true
