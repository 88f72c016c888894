#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/llama: the real llama.cpp (prebuilt from npm, llama-gen, 1 thread,
# --no-repack so it computes from the mapped weights) through
# libairs-preload.so, cold, with the recorded access order against the
# static layer order. The model has a large vocabulary and an
# untied output.weight: the first token needs a few rows of token_embd (the
# first quarter of the file), every layer and output.weight, so the static
# order (all of token_embd first) is wrong.
#   static    airs-memd with no state dir: layer order, nothing recorded
#   replayed  airs-memd with a state dir holding the recording of a first run
# Medians of --reps runs, on the fast disk and under the SD-card throttle
# (cgroup v1 blkio or v2 io.max on the disk holding the model, ~90 MB/s).
#
#   bench/llama/bench_order_llama.sh --build BUILD_DIR [--reps 3] [--bps 90000000] [--vocab 65536] [--work DIR]
# Needs root. Runs tests/llama/setup.sh if llama-gen is not built yet.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
. "$here/memd_lib.sh"
build="" reps=3 bps=90000000 work="" vocab=65536
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --bps) bps=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR [--reps 3] [--bps 90000000] [--vocab 65536] [--work DIR]" >&2; exit 2 ;;
  esac
done
[[ -n $build ]] || { echo "bench_order_llama: --build BUILD_DIR is required" >&2; exit 2; }
[[ $EUID -eq 0 ]] || { echo "bench_order_llama: needs root (drop_caches, cgroups)" >&2; exit 1; }
build=$(cd "$build" && pwd)
work=${work:-/var/tmp/airs-bench-order-llama}
mkdir -p "$work"
bench_tools bench_order_llama

model=$work/order-llama-v$vocab.gguf
[[ -f $model ]] || "$mk" --llama --out "$model" --layers 8 --embd 1024 --ff 2816 --vocab "$vocab" --types q8_0 \
  --seed 42 >/dev/null
model_bytes=$(stat -c %s "$model")
pool_bytes=$(( (model_bytes / 1048576 + 160) * 1048576 ))

# The throttle: a cgroup the daemon starts in.
disk_src=$(df --output=source "$work" | tail -1)
disk=$(lsblk -no PKNAME "$disk_src" 2>/dev/null | head -1)
majmin=$(lsblk -dno MAJ:MIN "/dev/${disk:-$(basename "$disk_src")}" | tr -d ' ')
cg=""
if [[ -d /sys/fs/cgroup/blkio ]]; then
  cg=/sys/fs/cgroup/blkio/airs-bench-order-llama-$$
  mkdir "$cg" && echo "$majmin $bps" >"$cg/blkio.throttle.read_bps_device"
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw io /sys/fs/cgroup/cgroup.controllers; then
  echo +io >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  cg=/sys/fs/cgroup/airs-bench-order-llama-$$
  mkdir "$cg" && echo "$majmin rbps=$bps" >"$cg/io.max"
else
  echo "bench_order_llama: no blkio/io cgroup controller: fast disk only" >&2
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -f $work/dbus.pid ]] && kill "$(cat "$work/dbus.pid")" 2>/dev/null || true
  [[ -n $cg ]] && rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
dbus-daemon --config-file="$src/tests/support/test-bus.conf" --print-address=3 --print-pid=4 --fork \
  3>"$work/bus.addr" 4>"$work/dbus.pid" 2>/dev/null
bus=$(head -1 "$work/bus.addr")

memd_pid=""
start_memd() {  # state_dir ("" = none), throttled (0/1)
  printf '[daemon]\nstate_dir = "%s"\n[pool]\nprofile = "custom"\nsize = "%d"\n' "$1" "$pool_bytes" >"$work/memd.conf"
  if [[ $2 == 1 ]]; then
    (echo "$BASHPID" >"$cg/cgroup.procs" && exec "$memd" --config "$work/memd.conf" --bus "$bus" --log-level debug) \
      >"$work/memd.log" 2>&1 &
  else
    "$memd" --config "$work/memd.conf" --bus "$bus" --log-level debug >"$work/memd.log" 2>&1 &
  fi
  memd_pid=$!
  pids+=("$memd_pid")
  wait_memd_up "$work/memd.log" "$memd_pid" bench_order_llama
}
stop_memd() {
  # Resident first: the recording (and the content id) are stored then.
  for _ in $(seq 600); do grep -q "fully resident" "$work/memd.log" && break; sleep 0.05; done
  sleep 0.3
  kill "$memd_pid"; wait "$memd_pid" 2>/dev/null || true
}
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
run_gen() {  # -> "first_token_ms wall_ms", tokens in $work/$1.tokens
  local t0 t1 out
  t0=$(date +%s%N)
  out=$(env LD_PRELOAD="$preload" AIRS_BUS="$bus" AIRS_PRELOAD_VERBOSE=1 "$gen" --backends "$llama_work/bins" \
    --model "$model" --n 4 --threads 1 --no-repack --mode mmap 2>"$work/$1.err") || { cat "$work/$1.err" >&2; exit 1; }
  t1=$(date +%s%N)
  grep -q "mapped from the pool" "$work/$1.err" || { echo "bench_order_llama: the pool was not used" >&2; cat "$work/$1.err" >&2; exit 1; }
  awk '/^tokens/' <<<"$out" >"$work/$1.tokens"
  echo "$(awk '/^first_token_ms/{print $2}' <<<"$out") $(( (t1 - t0) / 1000000 ))"
}
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# The first use records the order, on the slow disk where there is one: a
# recording ends when the model is resident, and on the fast disk that comes
# before llama.cpp's first token has touched much (docs/state.md).
rm -rf "$work/state"
start_memd "$work/state" "$([[ -n $cg ]] && echo 1 || echo 0)"
cold; run_gen first >/dev/null
for _ in $(seq 600); do grep -q "access order of" "$work/memd.log" && break; sleep 0.05; done
stop_memd
grep -q "access order of" "$work/memd.log" || { echo "bench_order_llama: nothing recorded:" >&2; cat "$work/memd.log" >&2; exit 1; }
recorded=$(grep -o "access order of [0-9]* of [0-9]* units" "$work/memd.log" | tail -1)

printf 'llama.cpp through the preload, model %s (%d bytes, vocab %d, untied output), 1 thread, --no-repack, %d reps (median)\n' \
  "$(basename "$model")" "$model_bytes" "$vocab" "$reps"
echo "recording: $recorded"
printf '%-22s %-9s %16s %10s %12s\n' disk order first_token_ms ratio wall_ms
for throttled in 0 1; do
  [[ $throttled == 1 && -z $cg ]] && continue
  label="fast disk"; [[ $throttled == 1 ]] && label="SD card $((bps / 1000000)) MB/s"
  declare -A ttft=() wall=()
  for r in $(seq "$reps"); do
    echo "$label rep $r/$reps ..." >&2
    for order in static replayed; do
      if [[ $order == static ]]; then start_memd "" "$throttled"; else start_memd "$work/state" "$throttled"; fi
      cold; read -r t w < <(run_gen "$order")
      if [[ $order == replayed ]] && ! grep -q "warm-up follows the recorded access order" "$work/memd.log"; then
        echo "bench_order_llama: the recording was not replayed:" >&2; cat "$work/memd.log" >&2; exit 1
      fi
      stop_memd
      ttft[$order]+="$t "; wall[$order]+="$w "
    done
  done
  base=$(median "${ttft[static]}")
  for order in static replayed; do
    t=$(median "${ttft[$order]}")
    printf '%-22s %-9s %16.1f %10.2f %12.0f\n' "$label" "$order" "$t" "$(awk -v a="$t" -v b="$base" 'BEGIN{print a/b}')" \
      "$(median "${wall[$order]}")"
  done
  unset ttft wall
done
cmp -s "$work/static.tokens" "$work/replayed.tokens" || { echo "bench_order_llama: tokens differ" >&2; exit 1; }
echo "tokens identical: $(cat "$work/static.tokens")"
