#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/experts/bench_hints.sh: airs-generate decoding a mixture of experts
# that the daemon streams (the model RATIO times its budget of the pool),
# with its expert hints on and off (off: with libairs' access sampling, as
# an unmodified runtime through the preload has it, and without,
# AIRS_SAMPLE_MS=0), and with hints and predictions (each layer's guess at
# the next layer's experts, --predict-experts), side by side in one run, at a read speed throttled to --sd-bps (100 MB/s by
# default: a cgroup v2 io.max or v1 blkio throttle on the disk holding the
# model, the daemon included; 0: the disk's own speed).
# Page cache dropped and a fresh daemon (--mode, full by default) before each run; the
# same prompt, seed and temperature, so the same routing: tokens must be
# identical, and the script fails if they are not.
#
# Per run, over the decode steps (the prefill and first token excluded:
# airs-generate --pause-at 1 holds there while the daemon's counters are
# read): decode tok/s, MiB read per token (the daemon's own count, and
# /proc/PID/io read_bytes of the daemon), MiB per token over MIN (Belady's
# optimum on the run's own expert trace and the same budget, from
# expert_bench, counted the same way: units of 2 MiB), and the expert hit
# rate (uses whose units were all in) that the daemon's policy (LFU with
# aging) has on that trace told every use (hints) or the misses only (no
# hints): expert_bench's replay, since the daemon does not see a hit
# without a hint to count it. With predictions, also how many were sent,
# the MiB read on them, and the share of the experts a predicted layer then
# chose that its guess named (guess_hit).
#
#   bench/experts/bench_hints.sh --build BUILD_DIR [--ratio 2.3] [--n 48]
#       [--skew 0] [--sd-bps 104857600] [--seed 11] [--mode full] [--work DIR]
# Needs root (drop_caches, cgroups, huge pages). Never part of the test suite.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
. "$here/../llama/memd_lib.sh"
build=""
ratio=2.3
n_gen=48
skew=0
sd_bps=104857600
seed=11
mode=full
work=""
usage() {
  echo "usage: $0 --build BUILD_DIR [--ratio 2.3] [--n 48] [--skew 0] [--sd-bps N] [--seed S] [--mode M] [--work DIR]" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --ratio) ratio=$2; shift 2 ;;
    --n) n_gen=$2; shift 2 ;;
    --skew) skew=$2; shift 2 ;;
    --sd-bps) sd_bps=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ -n $build ]] || usage
[[ $EUID -eq 0 ]] || { echo "bench_hints: needs root (drop_caches, cgroups)" >&2; exit 1; }
build=$(cd "$build" && pwd)
work=${work:-$build/bench/experts/work}
mkdir -p "$work"
mk=$build/src/gguf/airs-mkmodel
memd=$build/daemon/airs-memd
ctl=$build/src/airsctl/airsctl
gen=$build/src/infer/airs-generate
bench=$build/bench/experts/expert_bench
for f in "$mk" "$memd" "$ctl" "$gen" "$bench"; do [[ -x $f ]] || { echo "bench_hints: $f missing (build it)" >&2; exit 1; }; done

# The model of docs/streaming.md's expert cache tables: 8 layers of 32
# experts, 4 used per token, q8_0 (each expert's three slices 1.06 MiB).
layers=8 embd=1024 ff=1024 experts=32 used=4
model=$work/moe-skew$skew.gguf
[[ -f $model ]] || "$mk" --llama --out "$model" --layers $layers --embd $embd --ff $ff --vocab 2048 --experts $experts \
  --experts-used $used --types q8_0 --router-skew "$skew" --seed 42 >/dev/null
model_bytes=$(stat -c %s "$model")
# A streamed model gets at most 7/8 of the pool (the rest is left to KV
# and other models): the pool that makes the budget model/RATIO.
pool_bytes=$(awk -v m="$model_bytes" -v r="$ratio" 'BEGIN{ u = 2097152; b = m / r * 8 / 7; printf "%d", int((b + u - 1) / u) * u }')

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
if ((sd_bps > 0)); then throttle_on "$model" "$sd_bps"; else throttle_kind="not throttled"; fi

start_memd() {
  # The pressure loop kept out of it: the machine's own pressure must not
  # cut the budget under the measurement.
  printf '[pool]\nprofile = "custom"\nsize = "%d"\n[models]\nmode = "%s"\n[pressure]\nresize_pool = false\nsome_threshold = "1900ms"\nfull_threshold = "1900ms"\n' \
    "$pool_bytes" "$mode" >"$work/memd.conf"
  "$memd" --config "$work/memd.conf" --bus "$bus" --state-dir "" >"$work/memd.log" 2>&1 &
  memd_pid=$!
  wait_memd_up "$work/memd.log" "$memd_pid" bench_hints
}
stop_memd() { kill "$memd_pid"; wait "$memd_pid" 2>/dev/null || true; memd_pid=""; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
status_of_model() { "$ctl" --bus "$bus" --json status | jq '.models[0]'; }
io_read() { awk '/^read_bytes:/ {print $2}' "/proc/$memd_pid/io"; }

declare -A tps mib_tok io_tok hit hints hinted_mib budget preds pred_mib pred_hit touches
prompt="once upon a time in the forest by the river"
run() {  # VARIANT [airs-generate options...]
  local v=$1; shift
  cold
  start_memd
  rm -f "$work/go.fifo"; mkfifo "$work/go.fifo"
  "$gen" "$model" -p "$prompt" -n "$n_gen" --temp 1 --seed "$seed" --threads 2 --json --bus "$bus" --pause-at 1 \
    --expert-trace "$work/$v.trace" "$@" <"$work/go.fifo" >"$work/$v.out" 2>"$work/$v.err" &
  local p=$!
  exec 7>"$work/go.fifo"
  for _ in $(seq 12000); do grep -q '^paused' "$work/$v.out" && break; kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  grep -q '^paused' "$work/$v.out" || { echo "bench_hints: $v never paused" >&2; cat "$work/$v.err" >&2; exit 1; }
  local s0 s1 io0 io1 b0 b1
  s0=$(status_of_model)
  [[ $(jq -r .streamed <<<"$s0") == true ]] || { echo "bench_hints: $v: the model does not stream: $s0" >&2; exit 1; }
  b0=$(jq -r .bytes_read <<<"$s0")
  io0=$(io_read)
  echo >&7
  exec 7>&-
  wait "$p"
  s1=$(status_of_model)
  io1=$(io_read)
  b1=$(jq -r .bytes_read <<<"$s1")
  local j steps
  j=$(tail -1 "$work/$v.out")
  jq -c .token_ids <<<"$j" >"$work/$v.tokens"
  steps=$(( n_gen - 1 ))
  tps[$v]=$(jq -r '.decode_tok_s' <<<"$j")
  mib_tok[$v]=$(awk -v a="$b0" -v b="$b1" -v n="$steps" 'BEGIN{printf "%.1f", (b - a) / n / 1048576}')
  io_tok[$v]=$(awk -v a="$io0" -v b="$io1" -v n="$steps" 'BEGIN{printf "%.1f", (b - a) / n / 1048576}')
  hints[$v]=$(jq -r '.expert_hints // 0' <<<"$s1")
  hinted_mib[$v]=$(jq -r '(.hinted_bytes_read // 0) / 1048576 | floor' <<<"$s1")
  preds[$v]=$(jq -r '.expert_predictions // 0' <<<"$s1")
  pred_mib[$v]=$(jq -r '(.predicted_bytes_read // 0) / 1048576 | floor' <<<"$s1")
  pred_hit[$v]=$(jq -r 'if .prediction_hit_rate then (.prediction_hit_rate * 1000 | round / 1000) else "-" end' <<<"$j")
  budget[$v]=$(jq -r .budget_bytes <<<"$s1")
  touches[$v]=$(( $(jq -r '.resident_touches // 0' <<<"$s1") - $(jq -r '.resident_touches // 0' <<<"$s0") ))
  stop_memd
}

echo "hints on ..." >&2
run hints
echo "hints off, no sampling ..." >&2
AIRS_SAMPLE_MS=0 run nohints --no-hints
echo "hints off, access sampling (libairs' default) ..." >&2
run sampled --no-hints
echo "hints and predictions ..." >&2
run predict --predict-experts
cmp -s "$work/hints.tokens" "$work/nohints.tokens" || { echo "bench_hints: the tokens differ with and without hints" >&2; exit 1; }
cmp -s "$work/hints.tokens" "$work/sampled.tokens" || { echo "bench_hints: the tokens differ with sampling" >&2; exit 1; }
cmp -s "$work/hints.tokens" "$work/predict.tokens" || { echo "bench_hints: the tokens differ with predictions" >&2; exit 1; }
cmp -s "$work/hints.trace" "$work/nohints.trace" || { echo "bench_hints: the routing differs with and without hints" >&2; exit 1; }

# MIN on the run's own trace and budget (the decode steps only, as above).
real_ratio=$(awk -v m="$model_bytes" -v b="${budget[hints]}" 'BEGIN{printf "%.4f", m / b}')
"$bench" --model "$model" --trace "$work/hints.trace" --ratio "$real_ratio" >"$work/min.txt"
min_mib=$(awk '$1 == "MIN" {print $4}' "$work/min.txt")
hit[hints]=$(awk '$1 == "lfu" && $2 == "all" {print $4}' "$work/min.txt")
hit[nohints]=$(awk '$1 == "lfu" && $2 == "misses" {print $3}' "$work/min.txt")

echo
printf 'airs-generate, model %s (%.0f MiB, %d layers x %d experts, %d used, router skew %s), budget %.0f MiB (model %.2fx it), ' \
  "$(basename "$model")" "$(awk -v b="$model_bytes" 'BEGIN{print b/1048576}')" $layers $experts $used "$skew" \
  "$(awk -v b="${budget[hints]}" 'BEGIN{print b/1048576}')" "$real_ratio"
printf '%d tokens at temperature 1 (seed %s), 2 threads, %s mode, reads at %s (%s), cold page cache\n' \
  "$n_gen" "$seed" "$mode" "$( ((sd_bps > 0)) && awk -v b="$sd_bps" 'BEGIN{printf "%.0f MB/s", b/1e6}' || echo "the disk's own speed")" \
  "$throttle_kind"
hit[predict]=${hit[hints]}
hit[sampled]="-"
printf '%-10s %8s %10s %10s %8s %10s %8s %11s %8s %10s %9s %9s\n' variant tok/s MiB/token io_MiB/tok /MIN lfu_hit hints \
  hinted_MiB guesses guess_MiB guess_hit touches_in
for v in hints nohints sampled predict; do
  printf '%-10s %8.3f %10s %10s %8s %10s %8s %11s %8s %10s %9s %9s\n' "$v" "${tps[$v]}" "${mib_tok[$v]}" "${io_tok[$v]}" \
    "$(awk -v a="${mib_tok[$v]}" -v m="$min_mib" 'BEGIN{ if (m > 0) printf "%.2f", a / m; else printf "-" }')" \
    "${hit[$v]}" "${hints[$v]}" "${hinted_mib[$v]}" "${preds[$v]}" "${pred_mib[$v]}" "${pred_hit[$v]}" "${touches[$v]}"
done
echo "MIN on the same trace and budget: $min_mib MiB/token (expert_bench)"
echo "tokens identical with and without hints, with sampling, and with predictions: $(cat "$work/hints.tokens")"
