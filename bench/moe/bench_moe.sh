#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/moe: mixtures of experts bigger than the pool (2.3x and 4x by
# default), decoded end to end, side by side in one run:
#   llama.cpp mmap      the real llama.cpp (prebuilt, driven by llama-gen, 1
#                       thread, --no-repack) on its own mmap in a memory
#                       cgroup of the same memory the daemon's clients have:
#                       the pool plus the most anonymous memory any pool
#                       client of that model and speed held
#   llama.cpp MODE      the same llama.cpp through libairs-preload.so on
#                       airs-memd forced to MODE (full, small-pages,
#                       cooperative): the model streams, no option given
#   airs-generate MODE  our engine on the same daemon (1 thread, its KV in
#                       the daemon's blocks)
# per model (--experts: experts per layer, the rest of the shape fixed) and
# routing (--skews: airs-mkmodel --router-skew; 0 is the writer's plain
# random router, the closest it writes to uniform routing, and a higher skew
# a model of the hot experts real routers have, not a measurement of one),
# at the machine's own disk speed and throttled to --sd-bps (100 MB/s by
# default; bench/support/throttle.sh). Page cache dropped and the daemon
# started afresh before every run.
#
# Figures per run, for the decode steps only (each client pauses after its
# first token, --pause-at 1, and what it and the daemon read so far, the
# load and the prefill, is subtracted):
#   tok/s and its ratio to llama.cpp's mmap;
#   MiB read from storage per token (/proc/PID/io of the client and the
#   daemon) and its ratio to MIN, Belady's offline optimum on the same
#   expert trace (airs-generate --expert-trace of a direct run) and the
#   run's own streaming budget (bench/experts/expert_bench --budget: the
#   dense part resident, the rest of the budget an expert cache of 2 MiB
#   units);
#   "in memory": 1 - bytes read per token / bytes a token's weights are
#   (its dense part and K experts per layer: airs-generate's
#   weight_bytes_per_token), the share of what a token reads that was
#   already in memory (below 0: whole units read for parts of them);
#   of limit: tok/s / (bandwidth / bytes read per token), how close to the
#   storage limit the run decoded (bandwidth: --sd-bps throttled, an
#   O_DIRECT sequential read of the model at disk speed).
# And per model and routing, on the trace: the experts' hit rate of MIN
# and of the daemon's own policy replayed (LFU, misses only: what the
# daemon sees), and of the same at the same budget under synthetic uniform
# routing (expert_bench --uniform: the worst case, nothing to learn).
# Targets: decode >= 3x llama.cpp's mmap at 2.3x the pool, >= 6x at 4x, in
# every mode; bytes per token <= 1.2x MIN with the plain router.
# Greedy tokens: every llama.cpp run must give a direct load's, every
# airs-generate run the engine's direct run's; whether the engine and
# llama.cpp agree is printed.
#
#   bench/moe/bench_moe.sh --build BUILD_DIR [--pool 134M] [--page-size 2M] [--expert-unit 512K] [--experts "11 20"]
#       [--skews "0 3"] [--n 12] [--sd-bps 104857600] [--speeds "fast sd"]
#       [--modes "full small-pages cooperative"] [--engines "llama airs"]
#       [--hints "NAME=VALUE ..."] [--pressure] [--work DIR]
# --hints: the environment that turns the expert-hints channel on in every
# pool client (llama.cpp through the preload and airs-generate); the runs
# are labelled "+hints". Nothing by default.
# --pressure: the daemon's pressure loop as configured by default. Without
# it the loop stays out of the runs (thresholds of 1.9 s, the pool not
# resized), as bench/infer's: at 100 MB/s its PSI triggers fired during the
# decode and cut the budget of the model being decoded to its floor for the
# rest of the run (docs/streaming.md), which measures the pressure loop,
# not the streaming.
# Needs root (drop_caches, cgroups, huge pages). Never part of the test suite.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
. "$here/../llama/memd_lib.sh"
build=""
pool=134M
pool_page_size=""
expert_unit=""  # models.stream_expert_unit: the daemon's default when empty
experts_list="11 20"
skews="0 3"
n_gen=12
sd_bps=104857600
speeds="fast sd"
modes="full small-pages cooperative"
engines="llama airs"
hints=""
pressure=quiet
work=""
usage() {
  echo "usage: $0 --build BUILD_DIR [--pool 134M] [--page-size 2M] [--expert-unit 512K] [--experts \"11 20\"] [--skews \"0 3\"] [--n 12] [--sd-bps N]" \
    "[--speeds \"fast sd\"] [--modes \"full small-pages cooperative\"] [--engines \"llama airs\"]" \
    "[--hints \"NAME=VALUE ...\"] [--pressure] [--work DIR]" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --pool) pool=$2; shift 2 ;;
    --page-size) pool_page_size=$2; shift 2 ;;
    --expert-unit) expert_unit=$2; shift 2 ;;
    --experts) experts_list=$2; shift 2 ;;
    --skews) skews=$2; shift 2 ;;
    --n) n_gen=$2; shift 2 ;;
    --sd-bps) sd_bps=$2; shift 2 ;;
    --speeds) speeds=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --engines) engines=$2; shift 2 ;;
    --hints) hints=$2; shift 2 ;;
    --pressure) pressure=on; shift ;;
    --work) work=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ -n $build ]] || usage
(( n_gen >= 3 )) || { echo "bench_moe: --n must be at least 3" >&2; exit 2; }
[[ $EUID -eq 0 ]] || { echo "bench_moe: needs root (drop_caches, cgroups)" >&2; exit 1; }
build=$(cd "$build" && pwd)
work=${work:-$build/bench/moe/work}
mkdir -p "$work"
bench_tools bench_moe
agen=$build/src/infer/airs-generate
xbench=$build/bench/experts/expert_bench
for f in "$agen" "$xbench"; do [[ -x $f ]] || { echo "bench_moe: $f missing (build it)" >&2; exit 1; }; done
pool_bytes=$(numfmt --from=iec "$pool")
# The pool's page (pool.page_size; the daemon's default is 2 MiB): the
# shmem pool's (small-pages, cooperative) can be smaller, hugetlbfs's
# (full) cannot. A streamed mixture of experts on shmem is cut in
# models.stream_expert_unit (--expert-unit; the daemon's default 512 KiB)
# whatever the page. MIN is replayed in each run's unit.
unit_bytes=$(numfmt --from=iec "${pool_page_size:-2M}")
text="Hello world, this is a test"
t_start=$(date +%s)

source "$here/../support/throttle.sh"
bench=bench_moe
source "$here/../support/stream_lib.sh"
trap stream_cleanup EXIT
bus_start

# The models: one shape (8 layers of 1024 wide, experts 1024 wide: one
# expert's three q8_0 slices 1.06 MiB each, as bench/experts' model), 2 of
# N experts a token.
model_of() {  # experts skew
  local m=$work/moe-l8-e$1-k2-skew$2.gguf
  [[ -f $m ]] || "$mk" --llama --out "$m.tmp" --types q8_0 --layers 8 --embd 1024 --ff 1024 --vocab 2048 \
    --heads 8 --heads-kv 2 --experts "$1" --experts-used 2 --router-skew "$2" --seed 42 >/dev/null
  [[ -f $m ]] || mv "$m.tmp" "$m"
  echo "$m"
}

client_env=(AIRS_BUS="$bus")
[[ -n $hints ]] && read -r -a hint_env <<<"$hints" && client_env+=("${hint_env[@]}")
tag=""
[[ -n $hints ]] && tag="+hints"
now_ms() { date +%s%3N; }

declare -A tps ttft bpt anon budget rkey tokens_ok weight_bpt agree quarter minrep unirep limits failed
# run KEY ENGINE CGROUP [env...]: one cold run of ENGINE (llama: llama-gen
# on its own mmap, or through the preload when the env says so; airs:
# airs-generate, on the daemon when one runs), paused after its first token
# and held after its last, so the decode steps' bytes (the client's and the
# daemon's), the client's anonymous memory and the daemon's budget are
# taken while it still maps the model. A run that fails (exits, hangs past
# held_timeout, does not use the pool or does not stream) is killed and
# marked: failed[KEY] says why, and the bench goes on.
run_failed() {  # key reason
  failed[$1]=$2
  echo "bench_moe: $1 FAILED: $2" >&2
  held_kill
  return 1
}
run() {
  local key=$1 engine=$2 cg=$3; shift 3
  local cmd
  if [[ $engine == llama ]]; then
    cmd=("$gen" --backends "$llama_work/bins" --model "$model" --n "$n_gen" --threads 1 --no-repack --mode mmap
         --text "$text" --pause-at 1 --hold)
  else
    cmd=("$agen" "$model" -p "$text" -n "$n_gen" --threads 1 --json --pause-at 1 --hold)
    [[ -n $memd_pid ]] && cmd+=(--bus "$bus") || cmd+=(--no-daemon)
    [[ $key == *.ref ]] && cmd+=(--expert-trace "$work/$key.trace")
  fi
  held_start "$key" "$cg" env "$@" "${cmd[@]}"
  local t0 p=$held_pid
  t0=$(now_ms)
  held_wait "$key" '^paused$' || { run_failed "$key" "no first token"; return 1; }
  ttft[$key]=$(( $(now_ms) - t0 ))
  local b0=0 b1=0
  b0=$(read_bytes "$p")
  [[ -n $memd_pid ]] && b0=$(( b0 + $(read_bytes "$memd_pid") ))
  held_line
  if [[ $engine == llama ]]; then
    held_wait "$key" '^holding$' || { run_failed "$key" "no end of the decode"; return 1; }
  else
    held_wait "$key" '^\{' || { run_failed "$key" "no end of the decode"; return 1; }
  fi
  b1=$(read_bytes "$p")
  anon[$key]=$(awk '/^Anonymous:/ {s += $2} END {print s * 1024}' "/proc/$p/smaps_rollup")
  if [[ -n $memd_pid ]]; then
    b1=$(( b1 + $(read_bytes "$memd_pid") ))
    if [[ $engine == llama ]]; then
      grep -q "mapped from the pool" "$work/$key.err" || { run_failed "$key" "the pool was not used"; return 1; }
    else
      grep -q '"backend":"daemon"' "$work/$key.out" || { run_failed "$key" "not on the daemon"; return 1; }
    fi
    local m
    m=$("$ctl" --bus "$bus" --json status | jq '.models[0]')
    echo "$m" >"$work/$key.status.json"  # what the daemon says of the run
    [[ $(jq -r .streamed <<<"$m") == true ]] || { run_failed "$key" "did not stream: $m"; return 1; }
    budget[$key]=$(jq -r .budget_bytes <<<"$m")
    # The model's own unit (a mixture of experts on shmem streams in
    # models.stream_expert_unit): MIN is replayed at this budget and unit.
    rkey[$key]="${budget[$key]}:$(jq -r .unit_bytes <<<"$m")"
  fi
  local rc=0
  held_end || rc=$?
  (( rc == 0 )) || { run_failed "$key" "exited $rc"; return 1; }
  if [[ $engine == llama ]]; then
    awk '/^tokens/ {$1 = ""; print substr($0, 2)}' "$work/$key.out" >"$work/$key.tokens"
    local first total
    first=$(awk '/^first_token_ms/{print $2}' "$work/$key.out")
    total=$(awk '/^total_ms/{print $2}' "$work/$key.out")
    tps[$key]=$(awk -v n="$n_gen" -v f="$first" -v t="$total" 'BEGIN{printf "%.3f", (n - 1) * 1000 / (t - f)}')
  else
    local j
    j=$(grep '^{' "$work/$key.out")
    jq -r '.token_ids | map(tostring) | join(" ")' <<<"$j" >"$work/$key.tokens"
    tps[$key]=$(jq -r '.decode_tok_s * 1000 | round / 1000' <<<"$j")
  fi
  bpt[$key]=$(( (b1 - b0) / (n_gen - 1) ))
}

# The first line at which two token files part, or nothing when equal.
same_tokens() { cmp -s "$1" "$2"; }
first_diff() {
  awk 'NR == FNR {for (i = 1; i <= NF; ++i) a[i] = $i; n = NF; next}
       {for (i = 1; i <= (NF > n ? NF : n); ++i) if (a[i] != $i) {print i - 1; exit}}' "$1" "$2"
}

# What expert_bench says of TRACE (or --uniform TOKENS) at BUDGET bytes in
# units of UNIT bytes:
# "MIN_MiB MIN_hit LFU_MiB LFU_hit FLOOR_MiB" per decode token (the floor:
# the fewest reads any online policy can expect, uniform routing only).
replay() {  # model budget trace|uniform:N unit
  local from=(--trace "$3")
  [[ $3 == uniform:* ]] && from=(--uniform "${3#uniform:}")
  "$xbench" --model "$1" "${from[@]}" --budget "$2" --unit "$4" | awk '
    $1 == "MIN" {min_mib = $4; min_hit = $3}
    $1 == "lfu" && $2 == "misses" {lfu_mib = $4; lfu_hit = $3}
    $1 == "floor" && $2 == "online" {floor_mib = $4}
    /below the floor/ {print "- - - - -"; exit}
    END {if (min_mib != "") print min_mib, min_hit, lfu_mib, lfu_hit, (floor_mib == "" ? "-" : floor_mib)}'
}

# Concentration of the decode routing: "SHARE UNIFORM": the share of the
# decode uses the busiest quarter of each layer's experts took, and what
# uniform routing would give them.
busiest_quarter() {  # trace experts
  local q=$(( ($2 + 2) / 4 ))
  awk '$1 == "D" {for (i = 3; i <= NF; ++i) print $2, $i}' "$1" | sort | uniq -c | sort -k2,2n -k1,1nr |
    awk -v q="$q" -v e="$2" '{if ($2 != l) {l = $2; r = 0} if (++r <= q) s += $1; t += $1}
      END {printf "%.2f %.2f", (t > 0 ? s / t : 0), q / e}'
}

per_token() {  # key min_mib: bytes per token over MIN
  awk -v a="${bpt[$1]}" -v m="$2" 'BEGIN{ if (m != "-" && m > 0) printf "%.2f", a / 1048576 / m; else printf "-" }'
}

# report CFG SP LABEL: the table of one model, routing and speed.
report() {
  local cfg=$1 sp=$2 label=$3 bw=$sd_bps x k key name b bb mn mh ln lh umn umh uln ulh e m target
  [[ $sp == sd ]] || bw=$disk_bps
  x=$(ratio "$model_bytes" "$pool_bytes")
  local keys=(mmap) list=()
  for m in $modes; do for e in $engines; do keys+=("$e.$m"); list+=("$e.$m"); done; done
  echo
  echo "=== $(basename "$model"): $(mib "$model_bytes") MiB, ${x}x the pool, 2 of $n_exp experts a token, router skew $skew" \
    "(the busiest quarter of each layer's experts took ${quarter[$cfg]% *} of the decode uses, uniform routing" \
    "${quarter[$cfg]#* }); $sp: $label ==="
  echo "llama.cpp mmap in a $memcg_kind of $(mib "${limits[$cfg.$sp]}") MiB (pool + the pool clients' most anonymous" \
    "memory); a token's weights $(mib "${weight_bpt[$cfg]}") MiB; engine vs llama.cpp greedy tokens: ${agree[$cfg]}"
  printf '%-26s %8s %7s %8s %9s %7s %9s %8s %9s %8s  %s\n' variant tok/s /mmap ttft_ms MiB/tok /MIN in_memory of_limit \
    budget unit_KiB tokens
  # The smallest budget the daemon gave a pool run: llama.cpp's own mmap
  # is set against its MIN (its memory is the pool's and more).
  local least="" least_rk=""
  for k in "${list[@]}"; do
    bb=${budget[$cfg.$sp.$k]:-}
    [[ -n $bb && ( -z $least || $bb -lt $least ) ]] && { least=$bb; least_rk=${rkey[$cfg.$sp.$k]}; }
  done
  for k in "${keys[@]}"; do
    key=$cfg.$sp.$k
    if [[ $k == mmap ]]; then
      name="llama.cpp mmap"
      b=""
      mn=-
      [[ -n $least ]] && read -r mn _ _ _ <<<"${minrep[$cfg.$least_rk]}"
    else
      e=${k%%.*}; m=${k#*.}
      [[ $e == llama ]] && name="llama.cpp $m$tag" || name="airs-generate $m$tag"
      b=${budget[$key]:-}
      mn=-
      [[ -n $b ]] && read -r mn _ _ _ <<<"${minrep[$cfg.${rkey[$key]}]}"
    fi
    if [[ -n ${failed[$key]:-} ]]; then
      printf '%-26s FAILED: %s\n' "$name" "${failed[$key]}"
      continue
    fi
    printf '%-26s %8.3f %7s %8s %9s %7s %9s %8s %9s %8s  %s\n' "$name" "${tps[$key]}" \
      "$(ratio "${tps[$key]}" "${tps[$cfg.$sp.mmap]:-0}")" "${ttft[$key]}" "$(mib "${bpt[$key]}")" "$(per_token "$key" "$mn")" \
      "$(awk -v a="${bpt[$key]}" -v w="${weight_bpt[$cfg]}" 'BEGIN{printf "%.2f", 1 - a / w}')" \
      "$(awk -v t="${tps[$key]}" -v bw="$bw" -v r="${bpt[$key]}" 'BEGIN{ if (r > 0 && bw > 0) printf "%.2f", t / (bw / r); else printf "-" }')" \
      "${b:+$(mib "$b")}" "$([[ -n ${rkey[$key]:-} ]] && echo $(( ${rkey[$key]#*:} / 1024 )))" "${tokens_ok[$key]}"
  done
  # One line per distinct budget: the offline optimum and the daemon's own
  # policy replayed on this trace, and the same under uniform routing.
  local seen=" " r
  for k in "${list[@]}"; do
    r=${rkey[$cfg.$sp.$k]:-}
    [[ -z $r || $seen == *" $r "* ]] && continue
    seen+="$r "
    read -r mn mh ln lh _ <<<"${minrep[$cfg.$r]}"
    read -r umn umh uln ulh ufl <<<"${unirep[$cfg.$r]}"
    echo "budget $(mib "${r%%:*}") MiB in units of $(( ${r#*:} / 1024 )) KiB: this trace: MIN $mn MiB/token (expert hit rate $mh), the daemon's LFU replayed $ln" \
      "MiB/token (hit $lh); synthetic uniform routing: MIN $umn (hit $umh), LFU $uln (hit $ulh)," \
      "no online policy below $ufl"
  done
  target=3
  awk -v x="$x" 'BEGIN{exit !(x > 3.1)}' && target=6
  echo "targets: decode /mmap >= $target:$(for k in "${list[@]}"; do printf ' %s %s' "$k" \
    "$(ratio "${tps[$cfg.$sp.$k]:-0}" "${tps[$cfg.$sp.mmap]:-0}")"; done)"
  if [[ $skew == 0 ]]; then
    echo "         bytes per token / MIN <= 1.2 (plain router):$(for k in "${list[@]}"; do
      mn=-; b=${budget[$cfg.$sp.$k]:-}
      [[ -n $b ]] && read -r mn _ _ _ <<<"${minrep[$cfg.${rkey[$cfg.$sp.$k]}]}"
      printf ' %s %s' "$k" "$( [[ -n ${bpt[$cfg.$sp.$k]:-} ]] && per_token "$cfg.$sp.$k" "$mn" || echo -)"; done)"
  fi
}

disk_bps=""
bad=0
out=$work/report.txt
{
  printf 'bench_moe: pool %s MiB in pages of %s KiB (each run streams in its model'"'"'s unit: the unit_KiB column), %d tokens (%d decode steps), 1 thread, --no-repack, cold page cache, pressure loop %s, load at the start %s%s\n' \
    "$(mib "$pool_bytes")" "$((unit_bytes / 1024))" "$n_gen" "$((n_gen - 1))" "$pressure" "$(cut -d' ' -f1-3 /proc/loadavg)" "${tag:+, with hints ($hints)}"
} | tee "$out"
# Routing outermost: the plain router's runs (the targets') come first.
for skew in $skews; do
  for n_exp in $experts_list; do
    model=$(model_of "$n_exp" "$skew")
    model_bytes=$(stat -c %s "$model")
    cfg="e$n_exp.s$skew"
    echo "$cfg: $(basename "$model") ($(mib "$model_bytes") MiB, $(ratio "$model_bytes" "$pool_bytes")x the pool) ..." >&2
    # The reference tokens and the trace: direct loads, nothing in between.
    run "$cfg.llama.ref" llama "" || exit 1
    run "$cfg.airs.ref" airs "" || exit 1
    weight_bpt[$cfg]=$(grep '^{' "$work/$cfg.airs.ref.out" | jq -r .weight_bytes_per_token)
    if same_tokens "$work/$cfg.llama.ref.tokens" "$work/$cfg.airs.ref.tokens"; then
      agree[$cfg]="identical"
    else
      agree[$cfg]="part at step $(first_diff "$work/$cfg.llama.ref.tokens" "$work/$cfg.airs.ref.tokens")"
    fi
    [[ -s $work/$cfg.airs.ref.trace ]] || { echo "bench_moe: airs-generate wrote no expert trace" >&2; exit 1; }
    quarter[$cfg]=$(busiest_quarter "$work/$cfg.airs.ref.trace" "$n_exp")
    for sp in $speeds; do
      label="the machine's own disk"
      if [[ $sp == sd ]]; then
        throttle_on "$model" "$sd_bps"
        label="throttled to $(awk -v b="$sd_bps" 'BEGIN{printf "%.0f", b/1e6}') MB/s with a $throttle_kind on $throttle_disk"
      elif [[ -z $disk_bps ]]; then
        cold
        t0=$(now_ms)
        dd if="$model" of=/dev/null bs=2M iflag=direct status=none
        disk_bps=$(( model_bytes * 1000 / ($(now_ms) - t0) ))
        printf 'disk: O_DIRECT sequential read of a model %.0f MB/s\n' "$(awk -v b="$disk_bps" 'BEGIN{print b/1e6}')" | tee -a "$out"
      fi
      echo "$cfg $sp: pool runs ..." >&2
      most_anon=0
      for m in $modes; do
        for e in $engines; do
          k=$cfg.$sp.$e.$m
          models_toml=""
          [[ -z $expert_unit ]] || models_toml="stream_expert_unit = \"$expert_unit\""$'\n'
          if [[ $pressure == quiet ]]; then
            start_memd "$m" "$models_toml"$'[pressure]\nresize_pool = false\nsome_threshold = "1900ms"\nfull_threshold = "1900ms"\n'
          else
            start_memd "$m" "$models_toml"
          fi
          if [[ $e == llama ]]; then
            run "$k" llama "" LD_PRELOAD="$preload" AIRS_PRELOAD_VERBOSE=1 "${client_env[@]}" || true
          else
            run "$k" airs "" "${client_env[@]}" || true
          fi
          stop_memd
          cp "$work/memd.log" "$work/$k.memd.log"
          [[ -n ${anon[$k]:-} ]] && (( anon[$k] > most_anon )) && most_anon=${anon[$k]}
        done
      done
      # llama.cpp's mmap given the same memory: the pool plus the most any
      # pool client held of its own.
      limit=$(( pool_bytes + most_anon ))
      echo "$cfg $sp: llama.cpp mmap in $(mib "$limit") MiB ..." >&2
      memcg_make "$limit"
      run "$cfg.$sp.mmap" llama "$memcg" || true
      memcg_drop
      limits[$cfg.$sp]=$limit
      for k in mmap $(for m in $modes; do for e in $engines; do echo "$e.$m"; done; done); do
        key=$cfg.$sp.$k
        e=llama
        [[ $k == airs.* ]] && e=airs
        if [[ -n ${failed[$key]:-} ]]; then bad=1; continue; fi
        if same_tokens "$work/$cfg.$e.ref.tokens" "$work/$key.tokens"; then
          tokens_ok[$key]=yes
        else
          tokens_ok[$key]="NO (from step $(first_diff "$work/$cfg.$e.ref.tokens" "$work/$key.tokens"))"
          bad=1
        fi
        # MIN and the daemon's policy replayed at this run's budget.
        r=${rkey[$key]:-}
        [[ -z $r || -n ${minrep[$cfg.$r]:-} ]] ||
          minrep[$cfg.$r]=$(replay "$model" "${r%%:*}" "$work/$cfg.airs.ref.trace" "${r#*:}")
        [[ -z $r || -n ${unirep[$cfg.$r]:-} ]] || unirep[$cfg.$r]=$(replay "$model" "${r%%:*}" uniform:256 "${r#*:}")
      done
      report "$cfg" "$sp" "$label" | tee -a "$out"
      throttle_off
    done
  done
done
{
  echo
  echo "bench_moe: $(( $(date +%s) - t_start )) s in all; load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
  if (( bad )); then
    echo "bench_moe: a run FAILED or its tokens differ from a direct load (marked above)"
  else
    echo "tokens identical to a direct load in every run (llama.cpp's to llama.cpp's, airs-generate's to the engine's)"
  fi
} | tee -a "$out"
(( bad == 0 ))
