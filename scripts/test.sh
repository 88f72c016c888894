#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, from a bare Debian 12 / Raspberry Pi OS machine:
# installs the packages, reserves huge pages, builds four ways (optimised,
# ASan+UBSan, TSan, and arm64 with the cross toolchain), runs every test
# (unit, integration on the real kernel and a private D-Bus, the packages,
# systemd in nspawn, llama.cpp, arm64 under qemu, other kernels in VMs) and
# the fuzzer for a bounded time. Ends with the skipped tests and their
# reasons, the failed ones, and one line: "N passed, N failed, N skipped".
#
#   scripts/test.sh                  # everything
#   FUZZ_SECONDS=30 scripts/test.sh  # shorter fuzzing
#
# Where the time goes (2 cores): compiling is most of it, and a test stage
# keeps the processor mostly idle (its tests wait on the kernel, a device,
# a bus). So the next build runs beside each test stage, at the lowest CPU
# priority (nice 19, idle I/O class): the tests get the processor whenever
# they want it, the compiler the rest. Every build is a unity build
# (CMAKE_UNITY_BUILD: a directory's sources compiled as one unit, so the
# big headers are parsed once per directory instead of once per file).
# Each stage prints when it starts; the end prints each stage's time.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/root.sh; become_root "$@"

t_start=$SECONDS
elapsed() { printf '%dm%02ds' $(((SECONDS - t_start) / 60)) $(((SECONDS - t_start) % 60)); }
stage_names=(); stage_secs=()
stage_t0=$SECONDS; stage_name=""
stage() {  # NAME: ends the running stage, starts the next
  if [[ -n $stage_name ]]; then stage_names+=("$stage_name"); stage_secs+=($((SECONDS - stage_t0))); fi
  stage_name=$1; stage_t0=$SECONDS
  [[ -z $1 ]] || echo "==> $1 (at $(elapsed))"
}

stage "packages"
scripts/deps.sh
# The arm64 cross toolchain and :arm64 libraries, qemu and the VM tools: all
# of apt's work happens here, before any build runs beside another step.
scripts/cross-arm64.sh --deps-only
for p in qemu-system-x86 qemu-system-arm mmdebstrap cpio; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    apt-get install -y -qq --no-install-recommends "$p" ||
    echo "==> cannot install $p: the vm tests will skip, naming it"
done
# Integration tests run daemons with pools of their own; two run at once.
scripts/hugepages.sh $((3 * 1024 * 1024 * 1024))

jobs=$(nproc)
fuzz_seconds=${FUZZ_SECONDS:-60}
# One JUnit file per test stage (and per VM guest), counted at the end by
# scripts/tally.py; a stage that produced none is a failure, never a pass.
results=$PWD/test-results
rm -rf "$results"; mkdir -p "$results"
export AIRS_RESULTS_DIR=$results

# Line tables only (-g1): every backtrace and sanitizer report still names
# file and line, the packages are stripped anyway, and the builds take about
# a fifth less time than with full debug information.
common=(-G Ninja -DCMAKE_UNITY_BUILD=ON)
plain=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr
       "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
san_debug=(-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1 -DAIRS_BUILD_BENCH=OFF)

build() {  # dir, cmake args... [-- targets...]
  local dir=$1; shift
  local args=() targets=()
  while (($#)); do [[ $1 == -- ]] && { shift; targets=("$@"); break; }; args+=("$1"); shift; done
  mkdir -p "$dir"
  cmake -S . -B "$dir" "${common[@]}" "${args[@]}" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; return 1; }
  cmake --build "$dir" -j"$jobs" ${targets:+--target "${targets[@]}"}
}

# A build beside the next test stage: lowest CPU and I/O priority, output
# in DIR.log. bg_wait says how it ended (its log's tail on failure).
declare -A bg_pid=()
bg_build() {  # dir, build args...
  local dir=$1
  echo "==> build $dir in the background (at $(elapsed); log $dir.log)"
  nice -n 19 ionice -c 3 bash -c "$(declare -f build); common=(${common[*]@Q}); jobs=$jobs; build \"\$@\"" _ "$@" \
    >"$dir.log" 2>&1 &
  bg_pid[$dir]=$!
}
bg_wait() {  # dir: 0 when its build succeeded
  local dir=$1 rc=0
  wait "${bg_pid[$dir]}" || rc=$?
  unset "bg_pid[$dir]"
  if ((rc != 0)); then
    echo "==> build $dir FAILED (exit $rc):"; tail -40 "$dir.log"
    echo "the build of $dir failed (exit $rc), see $dir.log" >"$results/build-${dir//\//-}.missing"
  fi
  return $rc
}

run_ctest() {  # dir, label, stage name, prefix command...
  local dir=$1 label=$2 name=$3; shift 3
  echo "==> tests [$label] in $dir (at $(elapsed))"
  set +e
  "$@" ctest --test-dir "$dir" --output-on-failure -j"$jobs" -L "$label" --timeout 600 \
    --output-junit "$results/$name.xml" 2>&1 | tee "$dir/ctest-$name.log"
  set -e
  [[ -s $results/$name.xml ]] ||
    echo "ctest [$label] in $dir wrote no results (see $dir/ctest-$name.log)" >"$results/$name.missing"
}

stage "plain build"
build build "${plain[@]}"

stage "plain tests, packages, systemd, llama.cpp (ASan build beside)"
bg_build build-asan "${san_debug[@]}" -DAIRS_SANITIZE=address,undefined
# With the soak (label soak: a bounded minute of random kills, restarts,
# unloads, replaced files and pressure, every byte checked; a fresh seed
# each run, printed with the replay command on failure).
run_ctest build 'unit|integration|soak' plain
# The three .debs: lintian-clean, and libairs-dev builds C and C++ programs.
run_ctest build package package timeout 1200
# The package in a real systemd booted in systemd-nspawn.
run_ctest build e2e e2e timeout 600
# An unmodified llama.cpp (prebuilt, from npm) on the pool.
run_ctest build llama llama timeout 900

stage "ASan tests (arm64 and TSan builds beside)"
asan_ok=0; bg_wait build-asan || asan_ok=$?
# Beside the ASan tests: the arm64 cross build (the vm stage's arm64 guests
# run it), then the TSan build of the tests of code that has threads
# (tsan_tests in tests/CMakeLists.txt), not of the single-threaded pure
# cores a third time. Each leaves its exit code in DIR.rc.
(
  AIRS_CMAKE_ARGS="${common[*]:1}" nice -n 19 ionice -c 3 scripts/cross-arm64.sh --no-deps --build-only \
    >build-arm64.log 2>&1
  echo $? >build-arm64.rc
  nice -n 19 ionice -c 3 bash -c "$(declare -f build); common=(${common[*]@Q}); jobs=$jobs; build \"\$@\"" _ \
    build-tsan "${san_debug[@]}" -DAIRS_SANITIZE=thread -- tsan_tests >build-tsan.log 2>&1
  echo $? >build-tsan.rc
) &
beside=$!
if ((asan_ok == 0)); then
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest build-asan 'unit|integration' asan
fi
built() {  # dir: its background build succeeded (else its failure is recorded)
  [[ $(cat "$1.rc" 2>/dev/null) == 0 ]] && return 0
  echo "==> the build of $1 FAILED:"; tail -40 "$1.log"
  echo "the build of $1 failed (exit $(cat "$1.rc" 2>/dev/null || echo '?')), see $1.log" >"$results/build-$1.missing"
  return 1
}

stage "arm64: unit tests under qemu, .deb"
wait "$beside" || true
if built build-arm64; then
  set +e
  timeout 1200 scripts/cross-arm64.sh --no-deps --no-build 2>&1 | tee -a build-arm64.log
  set -e
  [[ -s $results/arm64.xml ]] ||
    echo "the arm64 unit tests wrote no results, see build-arm64.log" >"$results/arm64.missing"
fi

# The integration suite on other kernels, each booted in a VM (tests/vm,
# docs/vm-tests.md): Debian 12's own 6.1 (amd64, this machine's root over
# 9p, under TCG where KVM cannot boot a stock kernel) and Debian 13's arm64
# kernels with 16 KiB and 4 KiB pages (TCG, the build-arm64 tree in an
# extracted arm64 userland), and the arm64 .deb under systemd as PID 1.
# Each runs a selection of the tests that reach the kernel. Kernels and the
# userland are cached in /var/cache/airs-vm. A test that cannot run (no
# qemu, no mmdebstrap, no KVM when forced) skips, naming why.
stage "vm"
run_ctest build vm vm timeout 3000

stage "TSan tests (fuzzer build beside)"
CC=clang CXX=clang++ bg_build build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAIRS_FUZZ=ON \
  -DAIRS_FUZZ_SECONDS="$fuzz_seconds" -DAIRS_BUILD_BENCH=OFF -- gguf_fuzz gguf_fuzz_seeds
if built build-tsan; then
  # TSan maps shadow memory at fixed ranges; kernels with 32 bits of mmap
  # randomisation break that, so run without ASLR (setarch -R).
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    run_ctest build-tsan 'unit|integration' tsan setarch "$(uname -m)" -R
fi

stage "fuzzing"
if bg_wait build-fuzz; then run_ctest build-fuzz fuzz fuzz; fi
stage ""

echo
echo "==> done (at $(elapsed)); stage times:"
for i in "${!stage_names[@]}"; do printf '  %-60s %4dm%02ds\n' "${stage_names[$i]}" $((stage_secs[i] / 60)) $((stage_secs[i] % 60)); done
echo
python3 scripts/tally.py "$results"
