#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what airs-memd needs to build, test and run on Debian 12 /
# Raspberry Pi OS (bookworm). Idempotent; run as root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  liburing-dev libnuma-dev libspdlog-dev libfmt-dev
  libsdbus-c++-dev libsdbus-c++-bin libsystemd-dev
  libgtest-dev libgmock-dev libcli11-dev
  libtomlplusplus-dev nlohmann-json3-dev libxxhash-dev
  dbus-daemon dbus-bin
  clang libclang-rt-14-dev
  nodejs
  util-linux procps kmod
  systemd-container bc
  groff-base python3          # tests/unit/man: render and check the man pages
  lintian                     # tests/e2e/packages.sh: the .debs pass lintian
  jq linux-perf               # bench/llama reads airsctl --json; profiling the pager (perf)
)
if [[ "${1:-}" == "--run-only" ]]; then
  packages=(dbus-daemon dbus-bin util-linux procps)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "==> installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# npm ships with the nodejs package on some repositories and separately on
# Debian's own; install Debian's only when no npm is there.
if ! command -v npm >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm
fi
