#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One command from a fresh Debian 12 / Raspberry Pi OS machine to a running
# airs-memd: install packages, build, reserve huge pages, generate a demo GGUF
# model, start the daemon (on the system bus when one runs, else on a private
# bus started here), run airs-generate, the inference client, which maps the
# model lazily through the daemon and keeps its KV cache in a daemon session,
# and show `airsctl status` and `airsctl sessions`.
#
# The daemon keeps running afterwards; the script prints how to talk to it
# (ready-to-paste lines: with them a plain `airsctl status` reaches it) and
# how to stop it.
#
#   scripts/quickstart.sh     # as root, or as a user with sudo
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/root.sh; become_root "$@"

scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# Only what the demo runs (scripts/test.sh builds everything else).
cmake --build build -j"$(nproc)" --target airs-memd airsctl airs airs-generate airs-mkmodel

state=/run/airs-demo
mkdir -p "$state"
pool_bytes=$((512 * 1024 * 1024))
scripts/hugepages.sh "$pool_bytes"

# Stop a demo daemon left by an earlier run (its pid file is ours).
for f in "$state/airs-memd.pid" "$state/dbus.pid"; do
  if [[ -s $f ]] && kill -0 "$(cat "$f")" 2>/dev/null; then kill "$(cat "$f")"; sleep 0.3; fi
  rm -f "$f"
done

if [[ -S /run/dbus/system_bus_socket ]] && [[ -f /etc/dbus-1/system.d/org.aios.Airs1.conf ]]; then
  bus=system
else
  # No system bus with our policy here (e.g. a container, or not installed):
  # a private bus of our own.
  dbus-daemon --config-file=tests/support/test-bus.conf --print-address=3 --print-pid=4 --fork \
    3>"$state/bus.address" 4>"$state/dbus.pid"
  bus=$(head -1 "$state/bus.address")
fi

cat >"$state/airs-memd.conf" <<CONF
[pool]
size = "$pool_bytes"
CONF
nohup build/daemon/airs-memd --config "$state/airs-memd.conf" --bus "$bus" >"$state/airs-memd.log" 2>&1 &
echo $! >"$state/airs-memd.pid"
for _ in $(seq 100); do
  grep -q "serving org.aios.Airs1" "$state/airs-memd.log" && break
  if ! kill -0 "$(cat "$state/airs-memd.pid")" 2>/dev/null; then cat "$state/airs-memd.log"; exit 1; fi
  sleep 0.1
done

# A demo model (llama-shaped, deterministic random weights in Q4_K, Q8_0,
# Q4_0 and F16 tensors, a llama vocabulary) and a real inference client:
# airs-generate maps it lazily through the daemon, keeps the keys and values
# of attention in blocks of a daemon KV session, generates a few tokens
# (random weights: the text is noise) and holds the session for a minute so
# `airsctl status` and `airsctl sessions` show it with its blocks.
[[ -s "$state/demo-llama.gguf" ]] ||
  build/src/gguf/airs-mkmodel --llama --out "$state/demo-llama.gguf" --size 256M --seed 7
sleep 60 | build/src/infer/airs-generate "$state/demo-llama.gguf" --bus "$bus" -p "Once upon a time" -n 16 \
  --threads "$(nproc)" --json --hold >"$state/demo.log" 2>&1 &
demo_pid=$!
for _ in $(seq 1200); do
  grep -qs '"token_ids"' "$state/demo.log" && break
  if ! kill -0 "$demo_pid" 2>/dev/null; then cat "$state/demo.log"; exit 1; fi
  sleep 0.1
done
cat "$state/demo.log"

echo
build/src/airsctl/airsctl --bus "$bus" status
echo
build/src/airsctl/airsctl --bus "$bus" sessions
echo
echo "airs-memd is running (pid $(cat "$state/airs-memd.pid"), log $state/airs-memd.log)."
echo "Talk to it from this shell (paste):"
if [[ $bus != system ]]; then
  # airsctl's default bus is "system", and the bus library takes the system
  # bus's address from DBUS_SYSTEM_BUS_ADDRESS: point it at the private bus.
  echo "  export DBUS_SYSTEM_BUS_ADDRESS='$bus'"
fi
echo "  export PATH=\"$PWD/build/src/airsctl:\$PATH\""
echo "  airsctl status; airsctl sessions"
as=${SUDO_USER:+sudo }  # the pid files are root's
if [[ $bus != system ]]; then
  echo "Stop it:  ${as}kill \$(cat $state/airs-memd.pid) \$(cat $state/dbus.pid)"
else
  echo "Stop it:  ${as}kill \$(cat $state/airs-memd.pid)"
fi
