#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/infer: instructions per decoded token on arm64, airs-generate against
# the prebuilt arm64 llama.cpp (llama-gen, npm @node-llama-cpp/linux-arm64),
# counted, not timed: both run under qemu-user with a TCG plugin
# (qemu_insn_count.c, built here with the host compiler) that counts every
# guest instruction executed. The count is deterministic for one thread.
# Per token = (count of a run generating N2 tokens - one generating N1) /
# (N2 - N1): loading, the prompt and start-up cancel out, the decode steps
# (forward pass, sampling) remain.
#
# Then what it means for a Raspberry Pi 5 (Cortex-A76 at 2.4 GHz, LPDDR4X at
# about 17 GB/s):
#   bandwidth limit  = 17 GB/s / weight bytes read per token
#   instruction rate = 2.4 GHz * IPC / instructions per token, per core
#                      (IPC assumed, --ipc, default 2; with four cores, four
#                      times that if the work split perfectly)
# and the share of the bandwidth limit the instruction rate would reach if
# instructions were the only cost (above 100 %: memory is the limit).
#
#   bench/infer/insn_per_token.sh [--build-arm64 build-arm64] [--size 64M]
#       [--types "q8_0 q4_0"] [--cpus "cortex-a76 cortex-a53"] [--ipc 2]
#       [--tokens 4,8] [--work DIR]
# Needs qemu-user (qemu-aarch64, with plugin support: Debian 12's 7.2 has
# it), a host C compiler, the arm64 build (scripts/cross-arm64.sh) and npm
# (tests/llama/setup.sh installs llama.cpp's arm64 build on first use).
# Takes about a minute per type and CPU model.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$src/build-arm64 size=64M types="q8_0 q4_0" cpus="cortex-a76 cortex-a53" ipc=2 tokens=4,8 work=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-arm64) build=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --ipc) ipc=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)
work=${work:-$build/bench/infer/insn}
n1=${tokens%,*} n2=${tokens#*,}
((n2 > n1)) || { echo "insn_per_token: --tokens N1,N2 needs N2 > N1" >&2; exit 2; }
mkdir -p "$work"
gen=$build/src/infer/airs-generate
mk_arm64=$build/src/gguf/airs-mkmodel
for f in "$gen" "$mk_arm64"; do
  [[ -x $f ]] || { echo "insn_per_token: $f missing (scripts/cross-arm64.sh builds it)" >&2; exit 1; }
done
command -v qemu-aarch64 >/dev/null || { echo "insn_per_token: qemu-aarch64 missing (apt-get install qemu-user)" >&2; exit 1; }
llama=$build/tests/llama/work
[[ -x $llama/llama-gen ]] || sh "$src/tests/llama/setup.sh" "$src/tests/llama" "$llama" aarch64-linux-gnu-gcc >&2
plugin=$work/qemu_insn_count.so
if [[ ! -f $plugin || $here/qemu_insn_count.c -nt $plugin ]]; then
  "${CC:-cc}" -shared -fPIC -O2 -Wall -Wextra -Werror -o "$plugin" "$here/qemu_insn_count.c"
fi

prompt="Once upon a time"
# count CPU OUT PROGRAM ARGS...: the instructions PROGRAM executes under
# qemu-aarch64 -cpu CPU; its stdout into OUT.
count() {
  local cpu=$1 out=$2
  shift 2
  qemu-aarch64 -cpu "$cpu" -plugin "$plugin,out=$work/count" "$@" >"$out" 2>"$work/stderr" ||
    { echo "insn_per_token: $* failed: $(tail -3 "$work/stderr")" >&2; exit 1; }
  cat "$work/count"
}
per_token() { echo $(( ($2 - $1) / (n2 - n1) )); }
ours() {  # CPU MODEL N -> count; leaves the JSON in $work/ours.json
  count "$1" "$work/ours.json" "$gen" "$2" -p "$prompt" -n "$3" --threads 1 --no-daemon --json
}
llama_gen() {  # CPU MODEL N [--no-repack] -> count
  count "$1" "$work/llama.out" "$llama/llama-gen" --backends "$llama/bins" --model "$2" --n "$3" --text "$prompt" \
    --threads 1 "${@:4}"
}
json() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$work/ours.json" "$1"; }

rows=()
for t in $types; do
  model=$work/llama-$t-$size.gguf
  [[ -f $model ]] || qemu-aarch64 "$mk_arm64" --llama --types "$t" --size "$size" --out "$model" --seed 42 >/dev/null
  for cpu in $cpus; do
    a=$(ours "$cpu" "$model" "$n1"); b=$(ours "$cpu" "$model" "$n2")
    ours_pt=$(per_token "$a" "$b")
    kernels=$(json kernels); bytes=$(json weight_bytes_per_token)
    ours_tokens=$(json token_ids | tr -d '[] ')
    a=$(llama_gen "$cpu" "$model" "$n1"); b=$(llama_gen "$cpu" "$model" "$n2")
    llama_pt=$(per_token "$a" "$b")
    llama_tokens=$(sed -n 's/^tokens //p' "$work/llama.out" | tr ' ' ',')
    a=$(llama_gen "$cpu" "$model" "$n1" --no-repack); b=$(llama_gen "$cpu" "$model" "$n2" --no-repack)
    plain_pt=$(per_token "$a" "$b")
    # Leading tokens the two agree on (a q8_0 near-tie can part them later).
    same=0
    IFS=, read -ra o <<<"$ours_tokens"
    IFS=, read -ra l <<<"$llama_tokens"
    while ((same < ${#o[@]} && same < ${#l[@]})) && [[ ${o[same]} == "${l[same]}" ]]; do same=$((same + 1)); done
    same=$same/${#l[@]}
    rows+=("$t $cpu $kernels $bytes $ours_pt $llama_pt $plain_pt $same")
  done
done

python3 - "$ipc" "$size" "$n1" "$n2" "${rows[@]}" <<'EOF'
import sys
ipc = float(sys.argv[1]); size, n1, n2 = sys.argv[2], sys.argv[3], sys.argv[4]
clock, bw = 2.4e9, 17e9
print(f"instructions per decoded token, 1 thread, under qemu-user (a TCG plugin counting guest instructions);")
print(f"writer-made llama models of {size}; per token = (run of {n2} tokens - run of {n1}) / {int(n2) - int(n1)}")
print()
print(f"{'type':6} {'cpu':11} {'ours':13} {'ours/tok':>11} {'llama.cpp':>11} {'ratio':>6} {'no-repack':>11} {'ratio':>6} {'tokens as llama.cpp':>20}")
for r in sys.argv[5:]:
    t, cpu, k, b, o, l, p, same = r.split()
    o, l, p = int(o), int(l), int(p)
    print(f"{t:6} {cpu:11} {k:13} {o/1e6:10.2f}M {l/1e6:10.2f}M {o/l:6.2f} {p/1e6:10.2f}M {o/p:6.2f} {same:>20}")
print()
print(f"Raspberry Pi 5 (Cortex-A76 {clock/1e9:.1f} GHz, assumed IPC {ipc:g}; LPDDR4X ~{bw/1e9:.0f} GB/s), our kernels:")
print(f"{'type':6} {'bytes/tok':>10} {'bandwidth limit':>16} {'instr. rate, 1 core':>20} {'share':>6} {'4 cores':>9} {'share':>6}")
seen = set()
for r in sys.argv[5:]:
    t, cpu, k, b, o, l, p, same = r.split()
    if cpu != "cortex-a76" or t in seen:
        continue
    seen.add(t)
    b, o = int(b), int(o)
    lim = bw / b
    one = clock * ipc / o
    print(f"{t:6} {b/1e6:8.1f}MB {lim:11.1f} tok/s {one:14.1f} tok/s {one/lim:6.0%} {4*one:5.0f} tok/s {4*one/lim:6.0%}")
print("(share: the instruction rate as a share of the bandwidth limit; above 100 % the memory bandwidth, not")
print(" the instructions, bounds a Pi's decode speed. Weight bytes only: the KV cache read per token is small here.)")
EOF
