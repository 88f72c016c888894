#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# airs-generate cross-built for arm64, run under qemu-user the way a
# developer runs it (the emulator the build was configured with, no -L
# prefix): on each CPU model given, with one and with three threads, it
# must print its 8 tokens within a time limit, report the kernel family the
# CPU model calls for (in --json and on its start-up line), and give the
# same tokens everywhere (the kernels are the scalar path bit for bit).
#
#   generate_under_qemu.sh QEMU GENERATE MKMODEL WORK CPU:FAMILY...
#
# A run that times out is the hang this test exists for: a multi-threaded
# process whose dynamic loader and libc are two different glibc builds
# spins in pthread_create (docs/arm64.md). `qemu-aarch64 -L
# /usr/aarch64-linux-gnu` (or QEMU_LD_PREFIX) pairs the cross toolchain's
# loader with the :arm64 libc; the message names that.
set -eu
qemu=$1 gen=$2 mk=$3 work=$4
shift 4
mkdir -p "$work"
model=$work/tiny-q8_0.gguf
if [ ! -f "$model" ]; then
  "$qemu" "$mk" --llama --out "$model.tmp" --types q8_0 --layers 2 --embd 64 --ff 128 --vocab 300 --heads 4 \
    --heads-kv 2 --seed 1 >/dev/null
  mv "$model.tmp" "$model"
fi
ref=""
fail=0
for spec in "$@"; do
  cpu=${spec%%:*}
  family=${spec#*:}
  for threads in 1 3; do
    rc=0
    timeout 120 "$qemu" -cpu "$cpu" "$gen" "$model" -p "hello world" -n 8 --no-daemon --json --threads "$threads" \
      >"$work/out" 2>"$work/err" || rc=$?
    what="-cpu $cpu --threads $threads"
    if [ "$rc" = 124 ]; then
      echo "FAIL $what: no output in 120 s (a spin in pthread_create: loader and libc of different glibc builds?" \
        "QEMU_LD_PREFIX='${QEMU_LD_PREFIX:-}'; see docs/arm64.md)" >&2
      fail=1
      continue
    fi
    if [ "$rc" != 0 ]; then
      echo "FAIL $what: exit $rc: $(cat "$work/err")" >&2
      fail=1
      continue
    fi
    ids=$(sed -n 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/p' "$work/out")
    n=$(printf '%s' "$ids" | tr ',' '\n' | grep -c . || true)
    if [ "$n" != 8 ]; then
      echo "FAIL $what: $n tokens, not 8: $(cat "$work/out")" >&2
      fail=1
    fi
    if ! grep -q "\"kernels\":\"$family\"" "$work/out"; then
      echo "FAIL $what: --json does not say \"kernels\":\"$family\": $(cat "$work/out")" >&2
      fail=1
    fi
    plural=s
    [ "$threads" = 1 ] && plural=""
    if ! grep -q "; kernels $family, $threads thread$plural, KV in private memory\$" "$work/err"; then
      echo "FAIL $what: the start-up line does not name kernels $family: $(cat "$work/err")" >&2
      fail=1
    fi
    [ -n "$ref" ] || ref=$ids
    if [ "$ids" != "$ref" ]; then
      echo "FAIL $what: tokens $ids, not $ref as in the first run" >&2
      fail=1
    fi
    echo "ok $what: kernels $family, tokens $ids"
  done
done
exit "$fail"
