# SPDX-License-Identifier: Apache-2.0
# Sourced by the bench/llama scripts: what they share about the daemon they run.
# wait_memd_up LOG PID WHO: until airs-memd (PID, logging to LOG) serves its
# bus name; exits the script with its log when it died or never got there.
wait_memd_up() {
  for _ in $(seq 200); do
    grep -q "serving org.aios.Airs1" "$1" && return 0
    kill -0 "$2" 2>/dev/null || { cat "$1" >&2; exit 1; }
    sleep 0.05
  done
  echo "$3: airs-memd did not start" >&2; exit 1
}

# bench_tools WHO: the built programs every bench/llama script runs ($build
# and $src set; llama.cpp set up on first use, llama-gen built again when
# its source is newer): gen, mk, memd, ctl, preload.
bench_tools() {
  llama_work=$build/tests/llama/work
  if [[ ! -x $llama_work/llama-gen || $src/tests/llama/llama_gen.c -nt $llama_work/llama-gen ]]; then
    sh "$src/tests/llama/setup.sh" "$src/tests/llama" "$llama_work" "${CC:-cc}"
  fi
  gen=$llama_work/llama-gen
  mk=$build/src/gguf/airs-mkmodel
  memd=$build/daemon/airs-memd
  ctl=$build/src/airsctl/airsctl
  preload=$build/src/preload/libairs-preload.so
  for f in "$gen" "$mk" "$memd" "$ctl" "$preload"; do [[ -e $f ]] || { echo "$1: $f missing (build it)" >&2; exit 1; }; done
}
