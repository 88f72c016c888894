#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, from a bare Debian 12 / Raspberry Pi OS machine:
# installs the packages, reserves huge pages, builds four ways (optimised,
# ASan+UBSan and TSan with Clang, and arm64 with the cross toolchain), runs
# every test (unit, integration on the real kernel and a private D-Bus, the
# packages, systemd in nspawn, llama.cpp, arm64 under qemu, other kernels in
# VMs) and the fuzzer for a bounded time. Ends with the skipped tests and their
# reasons, the failed ones, and one line: "N passed, N failed, N skipped".
#
#   scripts/test.sh                  # everything
#   FUZZ_SECONDS=30 scripts/test.sh  # shorter fuzzing
#
# Where the time goes (2 cores): compiling is about half of it, the VM
# guests (emulated under TCG, about one core each) most of the rest, and a
# test stage keeps the processor mostly idle (its tests wait on the kernel,
# a device, a bus). So:
# - the next build runs beside each test stage, at the lowest CPU priority
#   (nice 19, idle I/O class): the tests get the processor whenever they
#   want it, the compiler the rest;
# - every build is a unity build (CMAKE_UNITY_BUILD: a target's sources
#   compiled as one unit, so the big headers are parsed, and their templates
#   compiled, once per target);
# - the tests' big headers (GoogleTest, sdbus-c++, nlohmann/json, much of
#   the standard library) are precompiled once per build, and the tests'
#   own code is built at -O1 (tests/CMakeLists.txt, AIRS_PCH); the
#   sanitizer builds are at -O0 but for the code whose tests compute
#   (below);
# - the packages only the later builds and the guests need (the arm64
#   cross toolchain, qemu, the VM tools), then the VM guests' kernels and
#   userlands, are fetched beside the first build (network and disk, not
#   the processor);
# - after the ASan tests, two lanes run side by side: Debian 12's own kernel
#   in a VM, the TSan tests, the arm64 .deb in a VM; and the arm64 tests
#   under qemu, the arm64 guests, then the fuzzer. Each lane waits only for
#   the build it needs.
# Each stage prints when it starts; the end prints each stage's (and each
# lane step's) time and how busy the processor was meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/root.sh; become_root "$@"

t_start=$SECONDS
elapsed() { printf '%dm%02ds' $(((SECONDS - t_start) / 60)) $(((SECONDS - t_start) % 60)); }
# Jiffies the processor was busy, and in all, since boot (every core).
cpu_jiffies() { awk '/^cpu / { busy = $2 + $3 + $4 + $7 + $8 + $9; print busy, busy + $5 + $6 }' /proc/stat; }
busy_since() {  # "BUSY TOTAL" from cpu_jiffies -> percent busy since then
  local b0 t0 b1 t1; read -r b0 t0 <<<"$1"; read -r b1 t1 < <(cpu_jiffies)
  echo $(( t1 > t0 ? 100 * (b1 - b0) / (t1 - t0) : 0 ))
}
run_cpu=$(cpu_jiffies)
stage_names=(); stage_secs=(); stage_busy=()
stage_t0=$SECONDS; stage_name=""; stage_cpu=$(cpu_jiffies)
stage() {  # NAME: ends the running stage, starts the next
  if [[ -n $stage_name ]]; then
    stage_names+=("$stage_name"); stage_secs+=($((SECONDS - stage_t0))); stage_busy+=("$(busy_since "$stage_cpu")")
  fi
  stage_name=$1; stage_t0=$SECONDS; stage_cpu=$(cpu_jiffies)
  [[ -z $1 ]] || echo "==> $1 (at $(elapsed))"
}

stage "packages"
# What the plain build needs. The arm64 cross toolchain and :arm64
# libraries, qemu and the VM tools are installed beside that build (below):
# on a bare machine they are about half of this stage, waiting on the
# network and the disk, not the processor.
scripts/deps.sh
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
# One unity file per target (batch size 0; CMake's default is 8 sources):
# the daemon's core was three, each instantiating and optimising the same
# sdbus-c++, nlohmann/json and fmt templates. GCC -O2 took 51.8 processor-
# seconds for the three and 36.6 for one.
unity=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=0)
common=(-G Ninja "${unity[@]}")
plain=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr
       "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
# The sanitizer builds use Clang, and the product stays GCC's (the
# optimised build, the packages, arm64), so both compilers keep the code
# honest. Both build at -O0 but for the code whose tests are bound by its
# own arithmetic (the engine, the GGUF parser and writer, the fuzzer),
# which builds at -O1 (airs_hot in cmake/AirsCompile.cmake). Measured on 2
# cores, quiet, the ASan+UBSan build with the fuzzer: 16.0 processor-minutes
# all at -O1, 9.7 this way; its tests 6.5 and 7.8 (408 s and 460 s).
san=(-DCMAKE_BUILD_TYPE=Debug -DAIRS_BUILD_BENCH=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
# The fuzzer (libFuzzer on the GGUF reader, with ASan and UBSan) is built in
# the ASan tree: the libraries it links are built there already, where a
# tree of its own compiled them again (about 2 minutes of processor time).
asan=("${san[@]}" -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1 -DAIRS_SANITIZE=address,undefined
      -DAIRS_FUZZ=ON -DAIRS_FUZZ_SECONDS="$fuzz_seconds")
tsan=("${san[@]}" -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1 -DAIRS_SANITIZE=thread)

# The processor time of each build and test step (its own processes', all
# cores), for the table at the end: the busy share of a stage says how full
# the processor was, not what filled it. Each step runs in a subshell of its
# own, whose finished children the times builtin sums: a forked shell starts
# from zero and reaps only its own children (the main shell also reaps the
# background jobs, whose time would land in whatever step it ran then).
cpu_tsv=$PWD/cpu-times.tsv
: >"$cpu_tsv"
cpu_record() {  # name: appends this subshell's finished children's processor seconds
  local f=$cpu_tsv.$BASHPID
  times >"$f"
  awk -v n="$1" 'NR == 2 { split($1, u, /[ms]/); split($2, k, /[ms]/)
    printf "%s\t%.0f\n", n, u[1] * 60 + u[2] + k[1] * 60 + k[2] }' "$f" >>"$cpu_tsv"
}
measured() {  # name, command...: runs the command in a subshell of its own, recording its processor time
  local name=$1; shift
  ( rc=0; "$@" || rc=$?; cpu_record "$name"; exit "$rc" )
}

build() {  # dir, cmake args... [-- targets...]
  local dir=$1; shift
  local args=() targets=()
  while (($#)); do [[ $1 == -- ]] && { shift; targets=("$@"); break; }; args+=("$1"); shift; done
  mkdir -p "$dir"
  (
    cmake -S . -B "$dir" "${common[@]}" "${args[@]}" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
    rc=0
    cmake --build "$dir" -j"$jobs" ${targets:+--target "${targets[@]}"} || rc=$?
    cpu_record "build $dir"
    exit "$rc"
  )
}

# The builds after the first run one after the other in the background,
# beside the test stages, at the lowest CPU and I/O priority: low_build
# DIR ARGS... (output in DIR.log). Each leaves its exit code in DIR.rc as it
# ends, and built DIR waits for it.
low_build() {
  nice -n 19 ionice -c 3 bash -c "$(declare -f build cpu_record); common=(${common[*]@Q}); jobs=$jobs;
    cpu_tsv=${cpu_tsv@Q}; build \"\$@\"" _ "$@"
}
beside=""
built() {  # dir: waits for its background build; 0 when it succeeded (else its failure is recorded)
  while [[ ! -s $1.rc ]] && kill -0 "$beside" 2>/dev/null; do sleep 2; done
  [[ $(cat "$1.rc" 2>/dev/null) == 0 ]] && return 0
  echo "==> the build of $1 FAILED:"; tail -40 "$1.log"
  echo "the build of $1 failed (exit $(cat "$1.rc" 2>/dev/null || echo '?')), see $1.log" >"$results/build-$1.missing"
  return 1
}

run_ctest() {  # dir, label[:name regex], stage name, prefix command... ($exclude: ctest -E)
  local dir=$1 spec=$2 name=$3 sel=(); shift 3
  sel=(-L "${spec%%:*}"); [[ $spec != *:* ]] || sel+=(-R "${spec#*:}")
  [[ -z ${exclude:-} ]] || { sel+=(-E "$exclude"); echo "==> not in this stage (they run in the plain and ASan stages): $exclude"; }
  echo "==> tests [$spec] in $dir (at $(elapsed))"
  set +e
  measured "tests $name" "$@" ctest --test-dir "$dir" --output-on-failure -j"$jobs" "${sel[@]}" --timeout 600 \
    --output-junit "$results/$name.xml" 2>&1 | tee "$dir/ctest-$name.log"
  set -e
  [[ -s $results/$name.xml ]] ||
    echo "ctest [$spec] in $dir wrote no results (see $dir/ctest-$name.log)" >"$results/$name.missing"
}

stage "plain build (the other packages, then the VM guests' kernels and userlands, fetched beside)"
# Beside the compiler, at the lowest priority, one after the other: the
# rest of apt's work (no other step uses apt meanwhile; the arm64 build
# waits for it, packages_ready below), then what the guests boot, into
# /var/cache/airs-vm. A failure of the second is only a log: the vm tests
# fetch again and fail there, naming it.
mkdir -p build
cmake -S . -B build "${common[@]}" "${plain[@]}" >build/configure.log 2>&1 || { cat build/configure.log; exit 1; }
rm -f packages-beside.rc
other_packages() {
  local rc=0
  scripts/cross-arm64.sh --deps-only || rc=$?
  for p in qemu-system-x86 qemu-system-arm mmdebstrap cpio; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      apt-get install -y -qq --no-install-recommends "$p" ||
      echo "==> cannot install $p: the vm tests will skip, naming it"
  done
  return "$rc"
}
(
  set +e
  renice -n 19 -p "$BASHPID" >/dev/null
  measured "packages beside the plain build (arm64, qemu, VM tools)" other_packages >packages-beside.log 2>&1
  echo $? >packages-beside.rc
  measured "VM kernels and userlands (fetch, extract)" \
    env AIRS_VM_PREPARE=1 ionice -c 3 ctest --test-dir build -L vm -j1 >vm-prepare.log 2>&1
) &
vm_prepare=$!
packages_ready() {  # waits for the packages installed beside the plain build; their log if that failed
  while [[ ! -s packages-beside.rc ]] && kill -0 "$vm_prepare" 2>/dev/null; do sleep 2; done
  [[ $(cat packages-beside.rc 2>/dev/null) == 0 ]] && return 0
  echo "==> installing the packages beside the plain build FAILED (the arm64 build and the VM guests need them):"
  tail -40 packages-beside.log
  return 1
}
build build "${plain[@]}"

stage "plain tests, packages, systemd, llama.cpp (ASan, then arm64 builds beside)"
# In the background from here on, one after the other: the ASan build (the
# next stage's, with the fuzzer), the arm64 cross build (the arm64 lane's
# tests and guests run it), and the TSan build of the tests of code that
# has threads (tsan_tests in tests/CMakeLists.txt, not the single-threaded
# pure cores a third time). Each starts as soon as the one before ends, so
# whatever processor a test stage leaves idle goes to the next build.
rm -f build-asan.rc build-arm64.rc build-tsan.rc
(
  set +e  # a failed build is recorded in its .rc; the ones after it still run
  low_build build-asan "${asan[@]}" >build-asan.log 2>&1
  echo $? >build-asan.rc
  if packages_ready >build-arm64.log 2>&1; then
    AIRS_CMAKE_ARGS="${unity[*]}" measured "build build-arm64" nice -n 19 ionice -c 3 \
      scripts/cross-arm64.sh --no-deps --build-only >build-arm64.log 2>&1
    echo $? >build-arm64.rc
  else
    echo 1 >build-arm64.rc
  fi
  low_build build-tsan "${tsan[@]}" -- tsan_tests >build-tsan.log 2>&1
  echo $? >build-tsan.rc
) &
beside=$!
# The packages installed beside the plain build are in by now (they took
# well under a minute of its several); the .debs below need one of them
# (file, for cpack's dpkg-shlibdeps), so wait for them all the same.
packages_ready || true
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
wait "$vm_prepare" || true

stage "ASan tests (arm64 and TSan builds beside)"
if built build-asan; then
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest build-asan 'unit|integration' asan
fi

# Two lanes side by side, each about one core: the VM guests are emulated
# (TCG: one busy host thread per guest), the TSan tests run one at a time.
# Lane "amd64" (its output in lane-amd64.log, printed when it ends): the
# integration suite on Debian 12's own 6.1 kernel in a VM (this build tree,
# this machine's root over 9p), the TSan tests, then the arm64 .deb under
# systemd in a VM (once the other lane has built it). Lane "arm64" (here):
# the unit tests under qemu-user and the .deb, Debian 13's arm64 kernels
# with 16 KiB and 4 KiB pages in VMs (the build-arm64 tree), then the
# fuzzer. The .deb guest and the fuzzer are placed so that the lanes take
# about as long. In one CI run, with both in the amd64 lane, its parts took
# 7m59s (6.1 guest), 5m49s (TSan), 1m27s (.deb guest) and 1m02s (fuzzer),
# the arm64 lane's 4m28s (build wait, qemu-user) and 9m32s (guests): the
# arm64 lane ended 2m17s earlier and left a core idle. Everything but the
# TSan tests runs at nice 19, as the builds still running beside them do: the builds
# share the processor evenly with the guests, and the TSan tests (whose
# own checks watch the daemon's loop) get it first. tests/vm and
# docs/vm-tests.md say what each guest runs. Kernels and userlands are in
# /var/cache/airs-vm; a guest that cannot run (no qemu, no mmdebstrap)
# skips, naming why.
stage "two lanes: [6.1 VM, TSan, arm64 .deb VM] | [arm64 qemu, arm64 VMs, fuzz]"
lane_steps=()
lane_step() {  # lane, step, seconds: recorded for the table at the end
  lane_steps+=("$(printf '  %-60s %4dm%02ds' "  [$1] $2" $(($3 / 60)) $(($3 % 60)))")
}
rm -f lane-amd64.steps arm64-debs.done
(
  step() { printf 'amd64\t%s\t%d\n' "$1" $((SECONDS - t)) >>lane-amd64.steps; t=$SECONDS; }
  t=$SECONDS
  run_ctest build 'vm:^vm\.debian12-' vm-amd64 timeout 3000 nice -n 19
  step "Debian 12 6.1 VM"
  if built build-tsan; then
    step "waiting for the TSan build"
    # TSan maps shadow memory at fixed ranges; kernels with 32 bits of mmap
    # randomisation break that, so run without ASLR (setarch -R).
    # The engine (built at -O1 here, src/infer: at -O0 its forward passes
    # took minutes under TSan) runs its thread pool under TSan in
    # InferSequence, InferMoe and five daemon-backed InferIntegration tests,
    # and a streamed MoE model in full mode. The
    # other two modes of that model (and their pool-page variants,
    # InferStreamedMoePoolPages) differ in the pager only, which the
    # StreamedClients and MoeStreamTest suites run under TSan; the four
    # left out test the daemon's choices (hostile hints, pressure order,
    # forced eviction, private memory) that the daemon's own suites run
    # under TSan. The small-pages variants of the pager's and the clients'
    # suites (76 tests, 407 s of 1065 in a CI run) are left out too: that
    # mode changes the pool's backend and how a unit is filled (a copy
    # through io_uring's own kernel workers), not which of our threads
    # meet, and the full-mode (and cooperative) variant of every one of
    # them runs here; plain, ASan and the guests run them all.
    exclude='InferStreamedMoe\.AMixtureOfExpertsBiggerThanThePoolGivesThePrivateTokens/[sc]|InferStreamedMoePoolPages\.|InferIntegration\.HostileExpertHints|InferIntegration\.RealPressureEvicts|InferIntegration\.ForcedEvictionIsRecomputed|InferIntegration\.DaemonBlocksPrivateMemory|/SmallPages|/smallpages|/small_pages' \
      TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
      run_ctest build-tsan 'unit|integration' tsan setarch "$(uname -m)" -R
    step "TSan tests"
  fi
  # The arm64 lane writes arm64-debs.done once its .debs are built (or
  # cannot be: the guest then skips, naming the .deb it lacks).
  while [[ ! -e arm64-debs.done ]] && kill -0 $$ 2>/dev/null; do sleep 2; done
  step "waiting for the arm64 .debs"
  run_ctest build 'vm:^vm\.debian13-6\.12-arm64-deb$' vm-arm64-deb timeout 1200 nice -n 19
  step "Debian 13 arm64 .deb VM"
) >lane-amd64.log 2>&1 &
lane_amd64=$!
t=$SECONDS
if built build-arm64; then
  lane_step arm64 "waiting for the arm64 build" $((SECONDS - t)); t=$SECONDS
  set +e
  measured "tests arm64 (qemu-user, .deb, lintian)" timeout 1200 nice -n 19 \
    scripts/cross-arm64.sh --no-deps --no-build 2>&1 | tee -a build-arm64.log
  arm64_rc=${PIPESTATUS[0]}
  set -e
  [[ -s $results/arm64.xml ]] ||
    echo "the arm64 unit tests wrote no results, see build-arm64.log" >"$results/arm64.missing"
  [[ -s $results/arm64-qemu.xml ]] ||
    echo "the arm64 tests under ctest (kernel families, llama.cpp) wrote no results, see build-arm64.log" \
      >"$results/arm64-qemu.missing"
  # After its tests the script compares airs-mkmodel's output with the
  # native one's, builds the .debs and runs lintian on them: each a check.
  ((arm64_rc == 0)) || echo "scripts/cross-arm64.sh exited $arm64_rc (a failed unit test is counted in arm64 too;" \
    "otherwise airs-mkmodel's bytes, cpack or lintian of the arm64 .debs failed), see build-arm64.log" \
    >"$results/arm64-script.missing"
  lane_step arm64 "unit tests under qemu-user, .deb" $((SECONDS - t)); t=$SECONDS
  : >arm64-debs.done
  run_ctest build 'vm:^vm\.debian13-6\.12-arm64(-16k)?$' vm-arm64 timeout 3000 nice -n 19
  lane_step arm64 "Debian 13 arm64 VMs (16k, 4k)" $((SECONDS - t)); t=$SECONDS
fi
: >arm64-debs.done
if built build-asan; then run_ctest build-asan fuzz fuzz nice -n 19; fi
lane_step arm64 "fuzzing" $((SECONDS - t)); t=$SECONDS
wait "$lane_amd64" || true
echo "==> lane amd64 (6.1 VM, TSan, arm64 .deb VM), its output:"
cat lane-amd64.log
while IFS=$'\t' read -r lane what secs; do lane_step "$lane" "$what" "$secs"; done < <(cat lane-amd64.steps 2>/dev/null)
wait "$beside" || true
stage ""

echo
echo "==> done (at $(elapsed)); stage times (and how busy the processor was, in % of all cores):"
for i in "${!stage_names[@]}"; do
  printf '  %-60s %4dm%02ds  %3d%% busy\n' "${stage_names[$i]}" $((stage_secs[i] / 60)) $((stage_secs[i] % 60)) "${stage_busy[$i]}"
  [[ ${stage_names[$i]} != "two lanes"* ]] || printf '%s\n' "${lane_steps[@]}"
done
read -r busy0 _ <<<"$run_cpu"; read -r busy1 _ < <(cpu_jiffies)
echo
echo "==> processor time of each part (its own processes, all cores), in minutes; the processor was busy" \
  "$(awk -v j=$((busy1 - busy0)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", j / hz / 60 }') minutes in all:"
sort -t$'\t' -k2,2nr "$cpu_tsv" |
  awk -F'\t' '{ printf "  %-60s %6.1f\n", $1, $2 / 60; s += $2 } END { printf "  %-60s %6.1f\n", "(sum)", s / 60 }'
rm -f "$cpu_tsv".*
echo
python3 scripts/tally.py "$results"
