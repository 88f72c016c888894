#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/kv/bench_kv_sampling.sh: what libairs' KV access sampling costs a
# decode loop, in one run, side by side: airs-generate's decode tokens/s
# on the daemon's KV blocks with sampling off (AIRS_KV_SAMPLE_MS=0), at
# its default (a round a second) and at its fastest (10 ms), runs
# interleaved (off, default, fastest, off, ...) so the machine's noise
# falls on all three alike; the best of --reps each, and the ratios to off.
# Also the minor faults each run took (getrusage of the child), which is
# what the sampling adds: a fault per page of a dropped chunk at its next
# touch.
#
#   bench/kv/bench_kv_sampling.sh --build BUILD_DIR [--size 200M] [--types q8_0] [--tokens 128] [--words 400] [--reps 3] [--work DIR]
# Needs root (huge pages).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build="" size=200M types=q8_0 tokens=128 words_n=400 reps=3 work=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --words) words_n=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR [--size 200M] [--types q8_0] [--tokens 128] [--words 400] [--reps 3] [--work DIR]" >&2; exit 2 ;;
  esac
done
[[ -n $build ]] || { echo "bench_kv_sampling: --build BUILD_DIR is required" >&2; exit 2; }
build=$(cd "$build" && pwd)
work=${work:-$build/bench/kv/sampling-work}
mkdir -p "$work"
gen=$build/src/infer/airs-generate
mk=$build/src/gguf/airs-mkmodel
memd=$build/daemon/airs-memd
for f in "$gen" "$mk" "$memd"; do
  [[ -x $f ]] || { echo "bench_kv_sampling: $f is missing: build it first" >&2; exit 2; }
done

model=$work/bench-$size-$types.gguf
[[ -f $model ]] || "$mk" --llama --types "$types" --out "$model" --size "$size" --seed 42 >/dev/null
model_bytes=$(stat -c %s "$model")
pool_bytes=$(( (model_bytes / 1048576 + 128) * 1048576 ))

# The private bus and the wait for the daemon, as the other benches have them.
. "$here/../llama/memd_lib.sh"
. "$here/../support/stream_lib.sh"
memd_pid=""
cleanup() {
  [[ -n $memd_pid ]] && kill "$memd_pid" 2>/dev/null || true
  [[ -f $work/dbus.pid ]] && kill "$(cat "$work/dbus.pid")" 2>/dev/null || true
}
trap cleanup EXIT
bus_start
# A state directory of its own (no spill tier shared with other daemons)
# and a pressure loop that stays out of the measurements.
rm -rf "$work/state"
printf '[daemon]\nstate_dir = "%s"\n[pool]\nprofile = "custom"\nsize = "%d"\n[kv]\nmax_arena_bytes = 67108864\nspill_limit = 0\n[pressure]\nresize_pool = false\nsome_threshold = "1900ms"\nfull_threshold = "1900ms"\n' "$work/state" "$pool_bytes" >"$work/memd.conf"
"$memd" --config "$work/memd.conf" --bus "$bus" >"$work/memd.log" 2>&1 &
memd_pid=$!
wait_memd_up "$work/memd.log" "$memd_pid" bench_kv_sampling

w=(the quick brown fox jumps over a lazy dog and runs far away into deep forest)
prompt=""
for ((i = 0; i < words_n; i++)); do prompt+="${w[i % ${#w[@]}]} "; done
# Warm the model into the pool first (not part of any number).
"$gen" "$model" -p "warm" -n 1 --bus "$bus" --json --threads 1 >/dev/null

# One decode: prints "tok/s minor-faults" (the faults of the child alone).
run() {
  AIRS_KV_SAMPLE_MS=$1 python3 - "$gen" "$model" "$prompt" "$tokens" "$bus" <<'EOF'
import json, os, resource, subprocess, sys
gen, model, prompt, tokens, bus = sys.argv[1:]
before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
out = subprocess.run([gen, model, "-p", prompt, "-n", tokens, "--bus", bus, "--json", "--threads", "2"],
                     check=True, capture_output=True, text=True).stdout
faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
j = json.loads(out.strip().splitlines()[-1])
print(j["decode_tok_s"], faults)
EOF
}

declare -A best faults
periods=(0 1000 10)
for p in "${periods[@]}"; do best[$p]=0; faults[$p]=0; done
for ((r = 0; r < reps; r++)); do
  for p in "${periods[@]}"; do
    read -r tps f < <(run "$p")
    faults[$p]=$f
    best[$p]=$(python3 -c "print(max($tps, ${best[$p]}))")
  done
done
echo "== airs-generate decode on daemon KV blocks, $size $types, ~$words_n-word prompt, $tokens tokens, 2 threads, best of $reps"
for p in "${periods[@]}"; do
  python3 -c "
p, tps, off, f = $p, ${best[$p]}, ${best[0]}, ${faults[$p]}
name = {0: 'sampling off', 1000: 'default (1 s)', 10: 'fastest (10 ms)'}[p]
print(f'{name:18s} AIRS_KV_SAMPLE_MS={p:<5d} {tps:8.2f} tok/s  {tps / off:5.3f}x off  {f:7d} minor faults (last run)')"
done
