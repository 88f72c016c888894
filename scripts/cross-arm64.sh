#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Cross-builds airs-memd for arm64 (Raspberry Pi OS / Debian arm64) with
# Debian's cross toolchain and :arm64 libraries, runs the unit tests under
# qemu-user (with them the kernels and airs-generate on a Cortex-A53 and a
# Cortex-A76 CPU model, and, label qemu, the engine against the prebuilt
# arm64 llama.cpp), and builds the arm64 .deb. Run as root on Debian 12
# (amd64).
#
# Run arm64 programs of this build as ctest does: `qemu-aarch64 [-cpu
# cortex-a76] build-arm64/...`, without `-L /usr/aarch64-linux-gnu` (or
# QEMU_LD_PREFIX): that prefix pairs the cross toolchain's dynamic loader
# with the :arm64 libc, two glibc builds, and a multi-threaded program then
# spins in pthread_create (docs/arm64.md).
#
#   scripts/cross-arm64.sh            # deps, build, unit tests, .deb, lintian
#   scripts/cross-arm64.sh --tests-only   # only the unit-test targets
#   scripts/cross-arm64.sh --no-deps ...   # skip the apt part
#   scripts/cross-arm64.sh --deps-only     # only the apt part
#   scripts/cross-arm64.sh --build-only    # deps (unless --no-deps) and the build
#   scripts/cross-arm64.sh --no-build      # tests and .deb of an earlier build
#
# With AIRS_RESULTS_DIR set (scripts/test.sh), the tests' results go to
# $AIRS_RESULTS_DIR/arm64.xml and arm64-qemu.xml (JUnit). Extra cmake
# arguments: AIRS_CMAKE_ARGS.
#
# Build directory: build-arm64/. Prints the time of each step.
set -euo pipefail
cd "$(dirname "$0")/.."

deps=1; tests_only=0; do_build=1; do_test=1
for a in "$@"; do
  case $a in
    --no-deps) deps=0 ;;
    --tests-only) tests_only=1 ;;
    --deps-only) do_build=0; do_test=0 ;;
    --build-only) do_test=0 ;;
    --no-build) do_build=0 ;;
    *) echo "usage: $0 [--no-deps] [--tests-only] [--deps-only|--build-only|--no-build]" >&2; exit 2 ;;
  esac
done
jobs=${JOBS:-$(nproc)}
t0=$(date +%s)
step() { echo "==> [$(( $(date +%s) - t0 ))s] $*"; }

if ((deps)); then
  . scripts/root.sh; become_root "$@"
  export DEBIAN_FRONTEND=noninteractive
  # Multiarch: arm64 packages come from the same Debian sources as amd64
  # (the sources file is not touched). On an arm64 machine (a Pi) they are
  # the native ones, and the native compilers already carry the
  # aarch64-linux-gnu- names the toolchain file uses.
  native=$(dpkg --print-architecture)
  toolchain=crossbuild-essential-arm64
  if [[ $native == arm64 ]]; then
    toolchain=build-essential
  elif ! dpkg --print-foreign-architectures | grep -qx arm64; then
    step "dpkg --add-architecture arm64"
    dpkg --add-architecture arm64
  fi
  step "apt-get update"
  apt-get update -qq
  # Architecture: all packages (CLI11, nlohmann-json)
  # serve both architectures from the amd64 install (scripts/deps.sh).
  # sdbus-c++-xml2cpp runs on the build machine: libsdbus-c++-bin (amd64).
  step "installing the cross toolchain, qemu-user and :arm64 libraries"
  apt-get install -y -qq --no-install-recommends \
    "$toolchain" qemu-user dpkg-dev file lintian \
    libsdbus-c++-bin libcli11-dev nlohmann-json3-dev \
    liburing-dev:arm64 libnuma-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64 \
    libsdbus-c++-dev:arm64 libsystemd-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 \
    libxxhash-dev:arm64 libtomlplusplus-dev:arm64 >/dev/null
fi

if ((!do_build && !do_test)); then step "done"; exit 0; fi
if ((do_build)); then
step "configure build-arm64"
# Line tables only (-g1), as in scripts/test.sh: backtraces keep file and
# line, the .deb is stripped, and the build takes about a fifth less time.
# The multiarch libdir on the command line too: a build-arm64 configured
# before the toolchain file set it keeps the cached lib/ otherwise. Neither
# the benchmarks nor the test executables that only the build machine runs
# (AIRS_HOST_ONLY_TESTS in tests/CMakeLists.txt) are built.
mkdir -p build-arm64
cmake -S . -B build-arm64 -G Ninja \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/packaging/toolchain-aarch64.cmake" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_LIBDIR:STRING=lib/aarch64-linux-gnu \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  -DAIRS_BUILD_BENCH=OFF -DAIRS_HOST_ONLY_TESTS=OFF ${AIRS_CMAKE_ARGS:-} >build-arm64/configure.log 2>&1 || { cat build-arm64/configure.log; exit 1; }

if ((tests_only)); then
  # Only the unit-test executables (and what they link).
  mapfile -t targets < <(grep -ho 'add_executable([A-Za-z_0-9]*' tests/unit/*/CMakeLists.txt | cut -d'(' -f2)
  # The programs the qemu-user tests of the engine run.
  targets+=(airs-generate airs-mkmodel)
  if ((${#targets[@]} == 0)); then
    echo "no unit-test targets found in build-arm64" >&2; exit 1
  fi
  step "build (unit-test targets: ${targets[*]})"
  cmake --build build-arm64 -j"$jobs" --target "${targets[@]}"
else
  step "build (the product, the tests qemu-user and the arm64 guests run)"
  cmake --build build-arm64 -j"$jobs"
fi
fi
if ((!do_test)); then step "done"; exit 0; fi

# The unit tests run one process per test binary, as the VM guests run
# theirs (tests/vm/batch.py: ctest's own selection, one JUnit entry per
# test): under qemu-user each process spends about 0.1 s of emulated
# dynamic linking and start-up before its first test. Measured on 2 idle
# cores, 386 tests: 35.3 s (65 s of processor time) one process per test,
# 17.2 s (26 s) one per binary. The tests whose check is ctest's own (the
# kernel family each CPU model gets: PASS_REGULAR_EXPRESSION) and the
# engine against llama.cpp (a fixture) run under ctest.
qemu_own='^unit\.qemu\.InferKernels\.'
batch_dir=$PWD/build-arm64/unit-batch
rm -rf "$batch_dir"; mkdir -p "$batch_dir"
step "unit tests under qemu-aarch64, one process per test binary"
unit_rc=0
tests/vm/batch.py plan "$PWD/build-arm64" "$batch_dir" 900 "$jobs" -L unit -E "$qemu_own" || unit_rc=$?
if ((unit_rc == 0)); then
  sh "$batch_dir/batch.sh" || unit_rc=$?
  tests/vm/batch.py junit "$batch_dir" || unit_rc=$?
  [[ -z ${AIRS_RESULTS_DIR:-} ]] || cp "$batch_dir/junit.xml" "$AIRS_RESULTS_DIR/arm64.xml"
fi
step "the kernel family per CPU model and the engine against llama.cpp, under ctest"
qemu_rc=0
ctest --test-dir build-arm64 -L 'unit|qemu' -R "$qemu_own|^qemu\." -j"$jobs" --output-on-failure --timeout 900 \
  ${AIRS_RESULTS_DIR:+--output-junit "$AIRS_RESULTS_DIR/arm64-qemu.xml"} || qemu_rc=$?
((unit_rc == 0 && qemu_rc == 0)) || { echo "arm64 tests failed (unit: exit $unit_rc, ctest: exit $qemu_rc)" >&2; exit 1; }

# The model writer must produce the same bytes on both architectures
# (tests compute expected bytes from a seed): compare with the native build
# when there is one.
if ((! tests_only)) && [[ -x build/src/gguf/airs-mkmodel ]]; then
  step "airs-mkmodel: arm64 (qemu) vs native output"
  tmp=$(mktemp -d)
  build/src/gguf/airs-mkmodel --out "$tmp/native.gguf" --size 8M --seed 3 >/dev/null
  qemu-aarch64 build-arm64/src/gguf/airs-mkmodel --out "$tmp/arm64.gguf" --size 8M --seed 3 >/dev/null
  if cmp "$tmp/native.gguf" "$tmp/arm64.gguf"; then echo "byte-identical"; else rm -rf "$tmp"; exit 1; fi
  rm -rf "$tmp"
fi

if ((! tests_only)); then
  step "cpack -G DEB (arm64)"
  # dpkg-shlibdeps resolves the arm64 libraries through the dpkg database
  # of the :arm64 packages; it must be told the host architecture.
  (cd build-arm64 && DEB_HOST_ARCH=arm64 cpack -G DEB)
  ls -l build-arm64/*.deb
  dpkg-deb --info build-arm64/airs-memd_*_arm64.deb | sed -n '/Package:/,$p'
  # The same lintian expectations as the amd64 packages (package.lint):
  # no error, no warning; lintian checks a foreign-architecture .deb here.
  step "lintian (arm64 .debs)"
  lint=0
  tests/e2e/packages.sh lint build-arm64 build-arm64 || lint=$?
  if ((lint == 77)); then echo "SKIPPED: lintian of the arm64 .debs (lintian is not installed)"
  elif ((lint != 0)); then exit "$lint"; fi
fi
step "done"
