#!/usr/bin/env bash
# bench/llama: the real llama.cpp (prebuilt from npm, driven by llama-gen,
# 1 thread) loading a >= 300 MB model from a cold page cache, side by side in
# one run:
#   mmap+populate  llama.cpp's default (MAP_SHARED|MAP_POPULATE + WILLNEED)
#   no-mmap        llama.cpp use_mmap=false: read() every tensor
#   pool (lazy)    through libairs-preload.so on a fresh airs-memd (model not
#                  in the pool yet): the daemon reads it with O_DIRECT while
#                  llama.cpp already runs
#   pool, 2nd proc a second process while the first still holds the model
# plus the physical limit (dd O_DIRECT sequential read of the file).
# Medians of --reps runs; ratios against mmap+populate.
#
#   bench/llama/bench_llama.sh --build BUILD_DIR [--size 320M] [--reps 3]
#                              [--no-repack] [--work DIR]
# Needs root (drop_caches, huge pages). Runs tests/llama/setup.sh if llama-gen
# is not built yet.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
. "$here/memd_lib.sh"
build=""
size=320M
reps=3
repack=""
work=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --no-repack) repack=--no-repack; shift ;;
    --work) work=$2; shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR [--size 320M] [--reps 3] [--no-repack] [--work DIR]" >&2; exit 2 ;;
  esac
done
[[ -n $build ]] || { echo "bench_llama: --build BUILD_DIR is required" >&2; exit 2; }
[[ $EUID -eq 0 ]] || { echo "bench_llama: needs root (drop_caches)" >&2; exit 1; }
build=$(cd "$build" && pwd)
work=${work:-$build/bench/llama/work}
mkdir -p "$work"
llama_work=$build/tests/llama/work
[[ -x $llama_work/llama-gen ]] || sh "$src/tests/llama/setup.sh" "$src/tests/llama" "$llama_work" "${CC:-cc}"
gen=$llama_work/llama-gen
mk=$build/src/gguf/airs-mkmodel
memd=$build/daemon/airs-memd
ctl=$build/src/airsctl/airsctl
preload=$build/src/preload/libairs-preload.so
for f in "$gen" "$mk" "$memd" "$ctl" "$preload"; do [[ -e $f ]] || { echo "bench_llama: $f missing (build it)" >&2; exit 1; }; done

model=$work/llama-$size.gguf
[[ -f $model ]] || "$mk" --llama --out "$model" --size "$size" --seed 42 >/dev/null
model_bytes=$(stat -c %s "$model")
pool_bytes=$(( (model_bytes / 1048576 + 64) * 1048576 ))

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -f $work/dbus.pid ]] && kill "$(cat "$work/dbus.pid")" 2>/dev/null || true
}
trap cleanup EXIT

dbus-daemon --config-file="$src/tests/support/test-bus.conf" --print-address=3 --print-pid=4 --fork \
  3>"$work/bus.addr" 4>"$work/dbus.pid" 2>/dev/null
bus=$(head -1 "$work/bus.addr")
printf '[pool]\nprofile = "custom"\nsize = "%d"\n' "$pool_bytes" >"$work/memd.conf"

memd_pid=""
start_memd() {
  "$memd" --config "$work/memd.conf" --bus "$bus" >"$work/memd.log" 2>&1 &
  memd_pid=$!
  pids+=("$memd_pid")
  wait_memd_up "$work/memd.log" "$memd_pid" bench_llama
}
stop_memd() { kill "$memd_pid"; wait "$memd_pid" 2>/dev/null || true; }

cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

gen_args=(--backends "$llama_work/bins" --model "$model" --n 4 --threads 1 $repack)
declare -A load ttft wall
add() { load[$1]+="$2 "; ttft[$1]+="$3 "; wall[$1]+="$4 "; }
run_gen() {  # name, env..., -- extra args
  local name=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local t0 t1 out
  t0=$(now_ms)
  out=$(env "${envs[@]}" "$gen" "${gen_args[@]}" "$@" 2>"$work/$name.err") || { cat "$work/$name.err" >&2; exit 1; }
  t1=$(now_ms)
  add "$name" "$(awk '/^load_ms/{print $2}' <<<"$out")" "$(awk '/^first_token_ms/{print $2}' <<<"$out")" $((t1 - t0))
  awk '/^tokens/' <<<"$out" >"$work/$name.tokens"
}

dd_ms=""
for r in $(seq "$reps"); do
  echo "rep $r/$reps ..." >&2
  cold; t0=$(now_ms); dd if="$model" of=/dev/null bs=2M iflag=direct status=none; dd_ms+="$(( $(now_ms) - t0 )) "

  cold; run_gen mmap -- --mode mmap
  cold; run_gen nommap -- --mode none

  # Pool, cold: a fresh daemon, model not in the pool, page cache dropped.
  start_memd
  cold; run_gen pool LD_PRELOAD="$preload" AIRS_BUS="$bus" AIRS_PRELOAD_VERBOSE=1 -- --mode mmap
  grep -q "mapped from the pool" "$work/pool.err" || { echo "bench_llama: the pool was not used:" >&2; cat "$work/pool.err" >&2; exit 1; }
  # Second process while a first one holds the model.
  mkfifo "$work/hold.fifo" 2>/dev/null || true
  env LD_PRELOAD="$preload" AIRS_BUS="$bus" "$gen" "${gen_args[@]}" --hold <"$work/hold.fifo" >"$work/first.out" 2>&1 &
  first=$!
  exec 7>"$work/hold.fifo"
  for _ in $(seq 600); do grep -q holding "$work/first.out" && break; sleep 0.05; done
  cold; run_gen pool2 LD_PRELOAD="$preload" AIRS_BUS="$bus" AIRS_PRELOAD_VERBOSE=1 -- --mode mmap
  exec 7>&-
  wait "$first"
  stop_memd
done

for v in nommap pool pool2; do
  cmp -s "$work/mmap.tokens" "$work/$v.tokens" || { echo "bench_llama: tokens of $v differ from mmap" >&2; exit 1; }
done

median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
base_load=$(median "${load[mmap]}")
base_ttft=$(median "${ttft[mmap]}")
base_wall=$(median "${wall[mmap]}")
echo
printf 'llama.cpp (npm @node-llama-cpp/linux-x64 3.22.1), model %s (%d bytes), 1 thread, %d reps (median), cold page cache%s\n' \
  "$(basename "$model")" "$model_bytes" "$reps" "${repack:+, --no-repack}"
printf 'O_DIRECT sequential read of the file (dd bs=2M): %s ms (%.0f MB/s)\n' "$(median "$dd_ms")" \
  "$(awk -v b="$model_bytes" -v ms="$(median "$dd_ms")" 'BEGIN{print b/1e3/ms}')"
printf '%-16s %12s %8s %16s %8s %12s %8s\n' variant load_ms ratio first_token_ms ratio wall_ms ratio
for v in mmap nommap pool pool2; do
  name=$v
  case $v in mmap) name=mmap+populate ;; nommap) name=no-mmap ;; pool) name="pool (lazy)" ;; pool2) name="pool, 2nd proc" ;; esac
  l=$(median "${load[$v]}"); t=$(median "${ttft[$v]}"); w=$(median "${wall[$v]}")
  printf '%-16s %12.1f %8.2f %16.1f %8.2f %12.0f %8.2f\n' "$name" "$l" "$(awk -v a="$l" -v b="$base_load" 'BEGIN{print a/b}')" \
    "$t" "$(awk -v a="$t" -v b="$base_ttft" 'BEGIN{print a/b}')" "$w" "$(awk -v a="$w" -v b="$base_wall" 'BEGIN{print a/b}')"
done
echo "tokens identical in every variant: $(cat "$work/mmap.tokens")"
