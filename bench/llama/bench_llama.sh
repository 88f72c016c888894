#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/llama: the real llama.cpp (prebuilt from npm, driven by llama-gen,
# 1 thread) loading a model from a cold page cache, side by side in one run,
# at two storage speeds: the machine's own disk ("fast") and the same disk
# throttled to an SD card's ~90 MB/s ("sd": a cgroup io.max throttle, or the
# cgroup v1 blkio one where the io controller is bound there, on the disk
# holding the model; every reader runs in that cgroup: dd, llama-gen and the
# daemon). Page cache dropped before every cold run.
#
# Per speed, medians of --reps runs, ratios against llama.cpp's default load
# (mmap+populate):
#   no-mmap        llama.cpp use_mmap=false: read() every tensor
#   mmap+populate  llama.cpp's default (MAP_SHARED|MAP_POPULATE + WILLNEED)
#   plain mmap     the same without the prefetch (plain_mmap.so): demand paging
#   warm cache     mmap+populate again, page cache still warm
#   MODE cold      through libairs-preload.so on a fresh airs-memd forced to
#                  MODE (full, small-pages, cooperative): model not in the pool
#   MODE 2nd proc  a second process while the first still holds the model
# plus the physical limit (dd O_DIRECT sequential read of the file).
#
# Then how the cost grows with clients: 1, 2, 4, 8 (--clients) llama-gen
# processes started together on one cold model, per mode and for llama.cpp's
# own mmap+populate: memory (one shared copy, the pool's resident bytes or the
# file in the page cache, + every process's private memory, its anonymous
# RSS), every process's time to first token (in start order), the daemon's CPU
# time per attached client (its threads' run time while the N attach and load,
# over N).
#
#   bench/llama/bench_llama.sh --build BUILD_DIR [--size 96M] [--reps 3]
#       [--sd-bps 94371840] [--speeds "fast sd"] [--modes "full small-pages cooperative"]
#       [--clients "1 2 4 8"] [--no-repack] [--work DIR]
# Needs root (drop_caches, cgroups, huge pages). Runs tests/llama/setup.sh if
# llama-gen is not built yet. Never part of the test suite's pass/fail.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
. "$here/memd_lib.sh"
build=""
size=96M
reps=3
repack=""
work=""
sd_bps=94371840
speeds="fast sd"
modes="full small-pages cooperative"
clients="1 2 4 8"
usage() {
  echo "usage: $0 --build BUILD_DIR [--size 96M] [--reps 3] [--sd-bps N] [--speeds \"fast sd\"]" \
    "[--modes \"full small-pages cooperative\"] [--clients \"1 2 4 8\"] [--no-repack] [--work DIR]" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --sd-bps) sd_bps=$2; shift 2 ;;
    --speeds) speeds=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --no-repack) repack=--no-repack; shift ;;
    --work) work=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ -n $build ]] || usage
[[ $EUID -eq 0 ]] || { echo "bench_llama: needs root (drop_caches, cgroups)" >&2; exit 1; }
build=$(cd "$build" && pwd)
work=${work:-$build/bench/llama/work}
mkdir -p "$work"
bench_tools bench_llama
plain=$work/plain_mmap.so
"${CC:-cc}" -std=c11 -O2 -Wall -Wextra -Werror -shared -fPIC "$here/plain_mmap.c" -o "$plain" -ldl

model=$work/llama-$size.gguf
[[ -f $model ]] || "$mk" --llama --out "$model" --size "$size" --seed 42 >/dev/null
model_bytes=$(stat -c %s "$model")
max_clients=$(tr ' ' '\n' <<<"$clients" | sort -n | tail -1)
pool_bytes=$(( (model_bytes / 1048576 + 64) * 1048576 ))

source "$here/../support/throttle.sh"

memd_pid=""
cleanup() {
  [[ -n $memd_pid ]] && kill "$memd_pid" 2>/dev/null || true
  [[ -f $work/dbus.pid ]] && kill "$(cat "$work/dbus.pid")" 2>/dev/null || true
  throttle_off
}
trap cleanup EXIT

dbus-daemon --config-file="$src/tests/support/test-bus.conf" --print-address=3 --print-pid=4 --fork \
  3>"$work/bus.addr" 4>"$work/dbus.pid" 2>/dev/null
bus=$(head -1 "$work/bus.addr")

start_memd() {  # mode
  printf '[pool]\nprofile = "custom"\nsize = "%d"\n[models]\nmode = "%s"\n' "$pool_bytes" "$1" >"$work/memd.conf"
  # No state dir: nothing recorded or replayed between runs (bench_order_llama.sh measures that).
  "$memd" --config "$work/memd.conf" --bus "$bus" --state-dir "" >"$work/memd.log" 2>&1 &
  memd_pid=$!
  wait_memd_up "$work/memd.log" "$memd_pid" bench_llama
}
stop_memd() { kill "$memd_pid"; wait "$memd_pid" 2>/dev/null || true; memd_pid=""; }
# CPU time of every live thread of a process (its io_uring workers too), ms.
cpu_ms() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.1f", s / 1e6}'; }
# A process's own memory: its anonymous pages (heap, KV cache, compute
# buffers, weights llama.cpp repacked). Not smaps' Private_*: that counts the
# model's shared pages as private while only one process maps them.
private_rss() { awk '/^Anonymous:/ {s += $2} END {print s * 1024}' "/proc/$1/smaps_rollup"; }
pool_resident() { "$ctl" --bus "$bus" --json status | jq '[.models[]?.resident_bytes] | add // 0'; }

cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a/b; else printf "-" }'; }
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

gen_args=(--backends "$llama_work/bins" --model "$model" --n 4 --threads 1 $repack)
pool_env=(LD_PRELOAD="$preload" AIRS_BUS="$bus" AIRS_PRELOAD_VERBOSE=1)
declare -A load ttft
run_gen() {  # key, env..., -- extra args
  local key=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local out
  out=$(env "${envs[@]}" "$gen" "${gen_args[@]}" "$@" 2>"$work/$key.err") || { cat "$work/$key.err" >&2; exit 1; }
  load[$key]+="$(awk '/^load_ms/{print $2}' <<<"$out") "
  ttft[$key]+="$(awk '/^first_token_ms/{print $2}' <<<"$out") "
  awk '/^tokens/' <<<"$out" >"$work/$key.tokens"
}
check_pool_used() {
  grep -q "mapped from the pool" "$work/$1.err" || { echo "bench_llama: the pool was not used:" >&2; cat "$work/$1.err" >&2; exit 1; }
}

# N llama-gen processes started together (cold), each holding its model until
# released. Prints: memory_bytes ttft_1 ... ttft_N daemon_cpu_ms.
scale_run() {  # n, pool|mmap
  local n=$1 kind=$2 i cpu0=0 cpu1=0 envs=()
  [[ $kind == pool ]] && envs=("${pool_env[@]}")
  local fifo=$work/hold.fifo
  rm -f "$fifo"; mkfifo "$fifo"
  cold
  [[ $kind == pool ]] && cpu0=$(cpu_ms "$memd_pid")
  local procs=()
  for i in $(seq "$n"); do
    env "${envs[@]}" "$gen" "${gen_args[@]}" --hold <"$fifo" >"$work/scale.$i.out" 2>"$work/scale.$i.err" &
    procs+=($!)
  done
  exec 7>"$fifo"
  for i in $(seq "$n"); do
    for _ in $(seq 1200); do grep -q holding "$work/scale.$i.out" && break; sleep 0.05; done
    grep -q holding "$work/scale.$i.out" || { echo "bench_llama: process $i of $n never held" >&2; cat "$work/scale.$i.err" >&2; exit 1; }
  done
  local mem=0 priv=0
  if [[ $kind == pool ]]; then
    cpu1=$(cpu_ms "$memd_pid")
    mem=$(pool_resident)
  else
    mem=$model_bytes  # one copy in the page cache, shared by every process
  fi
  local line=""
  for i in $(seq "$n"); do
    priv=$(( priv + $(private_rss "${procs[$((i - 1))]}") ))
    line+="$(awk '/^first_token_ms/{print $2}' "$work/scale.$i.out") "
  done
  exec 7>&-
  for p in "${procs[@]}"; do wait "$p"; done
  for i in $(seq "$n"); do
    cmp -s <(awk '/^tokens/' "$work/scale.$i.out") "$work/ref.tokens" ||
      { echo "bench_llama: tokens of process $i of $n ($kind) differ from a direct load" >&2; exit 1; }
  done
  echo "$(( mem + priv )) $priv $line$(awk -v a="$cpu1" -v b="$cpu0" 'BEGIN{print a - b}')"
}

report_speed() {  # speed label
  local sp=$1
  echo
  echo "=== $sp: $2 ==="
  printf 'O_DIRECT sequential read of the file (dd bs=2M): %s ms (%.0f MB/s)\n' "$(median "${load[$sp.dd]}")" \
    "$(awk -v b="$model_bytes" -v ms="$(median "${load[$sp.dd]}")" 'BEGIN{print b/1e3/ms}')"
  local base_l base_t warm_t
  base_l=$(median "${load[$sp.mmap]}"); base_t=$(median "${ttft[$sp.mmap]}"); warm_t=$(median "${ttft[$sp.warm]}")
  printf '%-26s %10s %8s %16s %8s %14s\n' variant load_ms /mmap first_token_ms /mmap /warm-cache
  local v name l t
  for v in nommap mmap plain warm $(for m in $modes; do echo "$m" "$m.2"; done); do
    case $v in
      nommap) name="llama.cpp --no-mmap" ;; mmap) name="llama.cpp mmap+populate" ;; plain) name="llama.cpp plain mmap" ;;
      warm) name="llama.cpp warm cache" ;; *.2) name="pool ${v%.2}, 2nd proc" ;; *) name="pool $v, cold" ;;
    esac
    l=$(median "${load[$sp.$v]}"); t=$(median "${ttft[$sp.$v]}")
    printf '%-26s %10.1f %8s %16.1f %8s %14s\n' "$name" "$l" "$(ratio "$l" "$base_l")" "$t" "$(ratio "$t" "$base_t")" \
      "$(ratio "$t" "$warm_t")"
  done
  local f
  f=$(median "${ttft[$sp.full]:-0}")
  echo "targets: pool cold TTFT/mmap+populate <= 1.00:$(for m in $modes; do printf ' %s %s' "$m" "$(ratio "$(median "${ttft[$sp.$m]}")" "$base_t")"; done)"
  echo "         2nd proc TTFT/warm-cache <= 1.00:$(for m in $modes; do printf ' %s %s' "$m" "$(ratio "$(median "${ttft[$sp.$m.2]}")" "$warm_t")"; done)"
  echo "         cold TTFT/full <= 1.20:$(for m in $modes; do [[ $m == full ]] || printf ' %s %s' "$m" "$(ratio "$(median "${ttft[$sp.$m]}")" "$f")"; done)"
  echo
  echo "--- $sp: N processes started together on one cold model ---"
  printf '%-18s %3s %10s %11s %8s %9s %9s %9s %11s  %s\n' loader N memory_MB "private_MB" /N=1 ttft_2nd ttft_last \
    last/2nd "cpu/client" "TTFT of each process, ms (start order)"
  local kind n res mem1 mem priv ts cpu t2 tl
  for kind in mmap $modes; do
    mem1=""
    for n in $clients; do
      res=${scale[$sp.$kind.$n]}
      mem=$(awk '{print $1}' <<<"$res")
      priv=$(awk '{print $2}' <<<"$res")
      ts=$(awk '{for (i = 3; i < NF; i++) printf "%.0f ", $i}' <<<"$res")
      cpu=$(awk '{print $NF}' <<<"$res")
      mem1=${mem1:-$mem}
      t2=$(awk '{print (NF >= 2) ? $2 : $1}' <<<"$ts"); tl=$(awk '{print $NF}' <<<"$ts")
      printf '%-18s %3d %10.1f %11.1f %8s %9.0f %9.0f %9s %11s  %s\n' \
        "$([[ $kind == mmap ]] && echo "llama.cpp mmap" || echo "pool $kind")" "$n" \
        "$(awk -v m="$mem" 'BEGIN{print m/1048576}')" "$(awk -v m="$priv" 'BEGIN{print m/1048576}')" \
        "$(ratio "$mem" "$mem1")" "$t2" "$tl" "$(ratio "$tl" "$t2")" \
        "$([[ $kind == mmap ]] && echo - || awk -v c="$cpu" -v n="$n" 'BEGIN{printf "%.1fms", c/n}')" "$ts"
    done
  done
  echo "targets: memory N=$max_clients / N=1 <= 1.10; TTFT of the last (N=$max_clients) / the 2nd <= 1.20"
}

declare -A scale
reports=()
# The reference tokens: a direct load, nothing in between.
cold; run_gen ref -- --mode mmap; cp "$work/ref.tokens" "$work/ref.tokens.keep"; mv "$work/ref.tokens.keep" "$work/ref.tokens"

for sp in $speeds; do
  label="the machine's own disk"
  if [[ $sp == sd ]]; then
    throttle_on "$model" "$sd_bps"
    label="throttled to $sd_bps B/s ($(awk -v b="$sd_bps" 'BEGIN{printf "%.0f", b/1e6}') MB/s) with a $throttle_kind on $throttle_disk ($throttle_majmin)"
  fi
  for r in $(seq "$reps"); do
    echo "$sp: rep $r/$reps ..." >&2
    cold; t0=$(now_ms); dd if="$model" of=/dev/null bs=2M iflag=direct status=none; load[$sp.dd]+="$(( $(now_ms) - t0 )) "
    cold; run_gen "$sp.nommap" -- --mode none
    cold; run_gen "$sp.plain" LD_PRELOAD="$plain" -- --mode mmap
    cold; run_gen "$sp.mmap" -- --mode mmap
    run_gen "$sp.warm" -- --mode mmap  # page cache still warm from the run before
    for m in $modes; do
      start_memd "$m"
      cold; run_gen "$sp.$m" "${pool_env[@]}" -- --mode mmap
      check_pool_used "$sp.$m"
      # Second process while a first one holds the model.
      rm -f "$work/hold.fifo"; mkfifo "$work/hold.fifo"
      env "${pool_env[@]}" "$gen" "${gen_args[@]}" --hold <"$work/hold.fifo" >"$work/first.out" 2>&1 &
      first=$!
      exec 7>"$work/hold.fifo"
      for _ in $(seq 600); do grep -q holding "$work/first.out" && break; sleep 0.05; done
      cold; run_gen "$sp.$m.2" "${pool_env[@]}" -- --mode mmap
      check_pool_used "$sp.$m.2"
      exec 7>&-
      wait "$first"
      stop_memd
    done
  done
  echo "$sp: scaling with clients ..." >&2
  for n in $clients; do scale[$sp.mmap.$n]=$(scale_run "$n" mmap); done
  for m in $modes; do
    for n in $clients; do
      start_memd "$m"  # a fresh daemon: the model is cold in the pool too
      scale[$sp.$m.$n]=$(scale_run "$n" pool)
      stop_memd
    done
  done
  for v in nommap plain mmap warm $(for m in $modes; do echo "$m" "$m.2"; done); do
    cmp -s "$work/ref.tokens" "$work/$sp.$v.tokens" || { echo "bench_llama: tokens of $sp $v differ from a direct load" >&2; exit 1; }
  done
  reports+=("$sp|$label")
  throttle_off
done

echo
printf 'llama.cpp (npm @node-llama-cpp/linux-x64), model %s (%d bytes), 1 thread, %d reps (median), cold page cache%s\n' \
  "$(basename "$model")" "$model_bytes" "$reps" "${repack:+, --no-repack}"
for rep in "${reports[@]}"; do report_speed "${rep%%|*}" "${rep#*|}"; done
echo
echo "tokens identical in every variant and process: $(cat "$work/ref.tokens")"
