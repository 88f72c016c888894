#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The engine on arm64 against the prebuilt arm64 llama.cpp, both under
# qemu-user on the same CPU model: the same greedy tokens for a writer-made
# llama model of each weight type the engine reads. Cortex-A53 runs our NEON
# path and llama.cpp's ARMv8.0 build; Cortex-A76 our sdot kernels and its
# dot-product build. Each process is bounded (120 s).
#
#   agreement_under_qemu.sh QEMU GENERATE MKMODEL LLAMA_WORK WORK CPU...
# LLAMA_WORK is tests/llama/setup.sh's output for the arm64 compiler
# (llama-ref and the @node-llama-cpp/linux-arm64 libraries).
set -eu
qemu=$1 gen=$2 mk=$3 llama=$4 work=$5
shift 5
mkdir -p "$work"
prompt="the quick brown fox jumps over the lazy dog and then it runs far away into the deep forest"
n=12
fail=0
# The first k comma-separated tokens of $1.
first() { printf '%s' "$1" | cut -d, -f"1-$2"; }
# How many leading tokens $1 and $2 share.
common() {
  k=0
  while [ "$k" -lt "$n" ] && [ "$(first "$1" $((k + 1)))" = "$(first "$2" $((k + 1)))" ]; do k=$((k + 1)); done
  echo "$k"
}
for types in f32 f16 q8_0 q4_0 q4_K; do
  model=$work/$types.gguf
  if [ ! -f "$model" ]; then
    "$qemu" "$mk" --llama --out "$model.tmp" --types "$types" --layers 4 --embd 256 --ff 512 --vocab 600 --heads 8 \
      --heads-kv 2 --seed 7 >/dev/null
    mv "$model.tmp" "$model"
  fi
  # llama.cpp on every CPU model first: where its own builds (ARMv8.0 and
  # dot-product) part ways, the logits had a near-tie that rounding decides,
  # and tokens after it say nothing about agreement.
  all=""
  for cpu in "$@"; do
    rc=0
    timeout 120 "$qemu" -cpu "$cpu" "$llama/llama-ref" --backends "$llama/bins" --model "$model" --kv f32 --n "$n" \
      --text "$prompt" >"$work/ref" 2>"$work/ref.err" || rc=$?
    if [ "$rc" != 0 ]; then
      echo "FAIL $types -cpu $cpu: llama-ref exit $rc: $(tail -3 "$work/ref.err")" >&2
      exit 1
    fi
    want=$(sed -n 's/^tokens //p' "$work/ref" | tr ' ' ',')
    eval "want_$(echo "$cpu" | tr -c 'a-z0-9\n' _)=\$want"
    [ -n "$all" ] || all=$want
  done
  agree=$n
  for cpu in "$@"; do
    eval "w=\$want_$(echo "$cpu" | tr -c 'a-z0-9\n' _)"
    k=$(common "$all" "$w")
    [ "$k" -ge "$agree" ] || agree=$k
  done
  if [ "$agree" -lt $((n / 2)) ]; then
    echo "FAIL $types: llama.cpp's own builds agree on only $agree of $n tokens: not a usable model" >&2
    fail=1
    continue
  fi
  for cpu in "$@"; do
    eval "want=\$want_$(echo "$cpu" | tr -c 'a-z0-9\n' _)"
    rc=0
    timeout 120 "$qemu" -cpu "$cpu" "$gen" "$model" -p "$prompt" -n "$n" --kv f32 --threads 2 --no-daemon --json \
      >"$work/ours" 2>"$work/ours.err" || rc=$?
    if [ "$rc" != 0 ]; then
      echo "FAIL $types -cpu $cpu: airs-generate exit $rc: $(cat "$work/ours.err")" >&2
      fail=1
      continue
    fi
    got=$(sed -n 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/p' "$work/ours")
    kernels=$(sed -n 's/.*"kernels":"\([a-z0-9-]*\)".*/\1/p' "$work/ours")
    same=$(common "$got" "$want")
    if [ "$same" -lt "$agree" ]; then
      echo "FAIL $types -cpu $cpu ($kernels): token $((same + 1)) differs: airs-generate $got, llama.cpp $want" >&2
      fail=1
    elif [ "$agree" -lt "$n" ]; then
      echo "ok $types -cpu $cpu ($kernels): the $agree tokens llama.cpp's builds agree on, as llama.cpp" \
        "(then a near-tie: ours $got, llama.cpp here $want)"
    else
      echo "ok $types -cpu $cpu ($kernels): $n tokens as llama.cpp: $got"
    fi
  done
done
exit "$fail"
