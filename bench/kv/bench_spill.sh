#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/kv/bench_spill.sh: the KV spill tier in one run, side by
# side: time to first token of airs-generate for a ~2K-token system prompt
#   1. computed from scratch (nothing cached),
#   2. matched in memory (a second process, the daemon still holds the blocks),
#   3. restored from the spill tier after a daemon restart (a clean stop
#      spills the cached prefix; the new daemon indexes the store and
#      MatchPrefix reads the blocks back),
# and the ratios restored/scratch (target <= 0.1) and restored/memory.
#
#   bench/kv/bench_spill.sh --build BUILD_DIR [--size 50M] [--types q8_0] [--words 600] [--work DIR]
# Needs root (huge pages). The restored case reads from the page cache when
# the machine has the entries cached (they were just written); add
# --drop-caches to drop them first (echo 3 > /proc/sys/vm/drop_caches).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build="" size=50M types=q8_0 words_n=600 work="" drop=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --words) words_n=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --drop-caches) drop=1; shift ;;
    *) echo "usage: $0 --build BUILD_DIR [--size 50M] [--types q8_0] [--words 600] [--work DIR] [--drop-caches]" >&2; exit 2 ;;
  esac
done
[[ -n $build ]] || { echo "bench_spill: --build BUILD_DIR is required" >&2; exit 2; }
build=$(cd "$build" && pwd)
work=${work:-$build/bench/kv/spill-work}
mkdir -p "$work"
gen=$build/src/infer/airs-generate
mk=$build/src/gguf/airs-mkmodel
memd=$build/daemon/airs-memd
for f in "$gen" "$mk" "$memd"; do
  [[ -x $f ]] || { echo "bench_spill: $f missing (build it)" >&2; exit 1; }
done
model=$work/spill-$types-$size.gguf
[[ -f $model ]] || "$mk" --llama --types "$types" --out "$model" --size "$size" --seed 42 >/dev/null
model_bytes=$(stat -c %s "$model")
pool_bytes=$(( (model_bytes / 1048576 + 192) * 1048576 ))
jq_() { python3 -c "import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); print($1)"; }

memd_pid=""
cleanup() {
  [[ -n $memd_pid ]] && kill "$memd_pid" 2>/dev/null || true
  [[ -f $work/dbus.pid ]] && kill "$(cat "$work/dbus.pid")" 2>/dev/null || true
}
trap cleanup EXIT
dbus-daemon --config-file="$src/tests/support/test-bus.conf" --print-address=3 --print-pid=4 --fork \
  3>"$work/bus.addr" 4>"$work/dbus.pid" 2>/dev/null
bus=$(head -1 "$work/bus.addr")
rm -rf "$work/state"
printf '[daemon]\nstate_dir = "%s"\n[pool]\nprofile = "custom"\nsize = "%d"\n[kv]\nmax_arena_bytes = 134217728\n[pressure]\nresize_pool = false\nsome_threshold = "1900ms"\nfull_threshold = "1900ms"\n' \
  "$work/state" "$pool_bytes" >"$work/memd.conf"
start_memd() {
  : >"$work/memd.log"
  "$memd" --config "$work/memd.conf" --bus "$bus" >>"$work/memd.log" 2>&1 &
  memd_pid=$!
  for _ in $(seq 400); do grep -q "serving org.aios.Airs1" "$work/memd.log" && return 0; sleep 0.05; done
  echo "bench_spill: airs-memd did not start" >&2; cat "$work/memd.log" >&2; exit 1
}
stop_memd() { kill -TERM "$memd_pid"; wait "$memd_pid" || true; memd_pid=""; }

words() { local n=$1 out=""; local w=(the quick brown fox jumps over a lazy dog and runs far away into deep forest); \
  for ((i = 0; i < n; i++)); do out+="${w[i % ${#w[@]}]} "; done; printf '%s' "$out"; }
words "$words_n" >"$work/sys.txt"
ttft() { "$gen" "$model" --system "$work/sys.txt" -p "$1" -n 2 --bus "$bus" --json --threads 1; }

start_memd
# Warm the model into the pool and the page cache (not part of any number).
"$gen" "$model" -p "warm" -n 1 --bus "$bus" --json --threads 1 >/dev/null
scratch=$(ttft "what is the river")
memory=$(ttft "tell me about the mountain")
stop_memd   # the clean stop spills the cached prefix
start_memd
"$gen" "$model" -p "warm again" -n 1 --bus "$bus" --json --threads 1 >/dev/null
[[ $drop == 1 ]] && { sync; echo 3 >/proc/sys/vm/drop_caches; }
restored=$(ttft "where does the road go")
stop_memd
grep -h "KV spill tier" "$work/memd.log" | tail -2

s_ms=$(echo "$scratch" | jq_ 'j["ttft_ms"]'); m_ms=$(echo "$memory" | jq_ 'j["ttft_ms"]'); r_ms=$(echo "$restored" | jq_ 'j["ttft_ms"]')
echo "prompt tokens $(echo "$scratch" | jq_ 'j["prompt_tokens"]'); matched: scratch $(echo "$scratch" | jq_ 'j["matched_tokens"]'), memory $(echo "$memory" | jq_ 'j["matched_tokens"]'), restored $(echo "$restored" | jq_ 'j["matched_tokens"]') (restored_tokens $(echo "$restored" | jq_ 'j["restored_tokens"]'))"
python3 -c "
s, m, r = float($s_ms), float($m_ms), float($r_ms)
print(f'ttft: scratch {s:.1f} ms, matched in memory {m:.1f} ms, restored from the spill tier after a restart {r:.1f} ms')
print(f'ratio restored/scratch {r/s:.3f} (target <= 0.1), memory/scratch {m/s:.3f}, restored/memory {r/m:.2f}')"
