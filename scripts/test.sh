#!/usr/bin/env bash
# The whole test suite, from a bare Debian 12 / Raspberry Pi OS machine:
# installs the packages, reserves huge pages, builds three ways (optimised,
# ASan+UBSan, TSan), runs every test (unit, integration on the real kernel
# and a private D-Bus, agreement with an independent GGUF parser), and runs
# the fuzzer for a bounded time. Ends with one line: "N passed, N failed".
#
#   scripts/test.sh            # everything
#   FUZZ_SECONDS=30 scripts/test.sh # shorter fuzzing
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/root.sh; become_root "$@"

scripts/deps.sh
# Integration tests run daemons with pools of their own; two run at once.
scripts/hugepages.sh $((3 * 1024 * 1024 * 1024))

jobs=$(nproc)
fuzz_seconds=${FUZZ_SECONDS:-60}
passed=0; failed=0; failures=()
# Each stage says when it starts (the run's stage times, in CI's log too).
elapsed() { printf '%dm%02ds' $((SECONDS / 60)) $((SECONDS % 60)); }

configure_build() {  # dir, cmake args... [-- build targets...]
  local dir=$1; shift
  local args=() targets=()
  while (($#)); do [[ $1 == -- ]] && { shift; targets=("$@"); break; }; args+=("$1"); shift; done
  echo "==> build $dir ${args[*]} (at $(elapsed))"
  cmake -S . -B "$dir" -G Ninja "${args[@]}" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  if ((${#targets[@]})); then
    cmake --build "$dir" -j"$jobs" --target "${targets[@]}"
  else
    cmake --build "$dir" -j"$jobs"
  fi
}

run_ctest() {  # dir, label, extra prefix command...
  local dir=$1 label=$2; shift 2
  local log="$dir/ctest-$label.log"
  echo "==> tests [$label] in $dir (at $(elapsed))"
  set +e
  "$@" ctest --test-dir "$dir" --output-on-failure -j"$jobs" -L "$label" --timeout 600 2>&1 | tee "$log"
  set -e
  local line p t
  line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1 || true)
  if [[ -z "$line" ]]; then
    if grep -q 'No tests were found' "$log"; then return 0; fi
    failures+=("$dir:$label (ctest did not finish)"); failed=$((failed + 1)); return 0
  fi
  t=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
  p=$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$line")
  passed=$((passed + t - p)); failed=$((failed + p))
  ((p == 0)) || failures+=("$dir:$label")
}

# Line tables only (-g1), here and in the sanitizer builds below: every
# backtrace and sanitizer report still names file and line, the packages
# are stripped anyway, and the builds take about a fifth less time than
# with full debug information (variable locations, which CI does not read).
configure_build build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
run_ctest build 'unit|integration'
# The three .debs: lintian-clean, and libairs-dev builds C and C++ programs.
run_ctest build package timeout 1200
# The package in a real systemd booted in systemd-nspawn (about a minute).
run_ctest build e2e timeout 600
# An unmodified llama.cpp (prebuilt, from npm) on the pool (about a minute).
run_ctest build llama timeout 900
# arm64: cross-built with Debian's cross toolchain (all of it: the vm tests
# below run its integration and llama tests in arm64 guests), unit tests
# under qemu-user, the arm64 .deb. About 6 minutes.
echo "==> arm64 cross build, unit tests under qemu, .deb (at $(elapsed))"
set +e
timeout 1800 scripts/cross-arm64.sh > build-arm64.log 2>&1
arm64_rc=$?
set -e
tail -5 build-arm64.log
arm64_line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' build-arm64.log | tail -1 || true)
if [[ $arm64_rc -ne 0 || -z "$arm64_line" ]]; then
  failures+=("arm64 (exit $arm64_rc, see build-arm64.log)"); failed=$((failed + 1))
else
  t=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$arm64_line"); p=$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$arm64_line")
  passed=$((passed + t - p)); failed=$((failed + p)); ((p == 0)) || failures+=("arm64")
fi

# The integration suite on other kernels, each booted in a VM (tests/vm;
# issue 16): Debian 12's own 6.1 (amd64, this machine's root over 9p; the
# integration and llama tests, about 10 minutes under TCG where KVM cannot
# boot a stock kernel, which is detected at once), and Debian 13's arm64
# kernels with 16 KiB and 4 KiB pages (TCG, the build-arm64 tree above in an
# extracted arm64 userland, at most 8 minutes each), and the arm64 .deb
# installed and driven under systemd as PID 1 in the 4k kernel (about 3.5
# minutes; docs/vm-tests.md). Kernels and the
# userland are cached in /var/cache/airs-vm. A test that cannot run (no
# qemu, no mmdebstrap, no KVM when forced) skips, naming why.
for p in qemu-system-x86 qemu-system-arm mmdebstrap cpio; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" ||
    echo "==> cannot install $p: the vm tests will skip, naming it"
done
run_ctest build vm timeout 3000

san_debug=(-DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1)
configure_build build-asan -DCMAKE_BUILD_TYPE=Debug -DAIRS_SANITIZE=address,undefined -DAIRS_BUILD_BENCH=OFF "${san_debug[@]}"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build-asan 'unit|integration'

# TSan maps shadow memory at fixed ranges; kernels with 32 bits of mmap
# randomisation break that, so run without ASLR (setarch -R).
configure_build build-tsan -DCMAKE_BUILD_TYPE=Debug -DAIRS_SANITIZE=thread -DAIRS_BUILD_BENCH=OFF "${san_debug[@]}"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_ctest build-tsan 'unit|integration' setarch "$(uname -m)" -R

CC=clang CXX=clang++ configure_build build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAIRS_FUZZ=ON \
  -DAIRS_FUZZ_SECONDS="$fuzz_seconds" -DAIRS_BUILD_BENCH=OFF -- gguf_fuzz gguf_fuzz_seeds
run_ctest build-fuzz fuzz

echo
echo "==> done (at $(elapsed))"
if ((${#failures[@]})); then echo "failed suites: ${failures[*]}"; fi
echo "$passed passed, $failed failed"
((failed == 0))
