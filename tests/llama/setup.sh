#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs the prebuilt llama.cpp from npm (exact versions: package-lock.json)
# into WORK and builds llama-gen and llama-ref against it. Needs node/npm and a C compiler;
# fails loudly (never skips) when the registry or a tool is missing.
#
#   tests/llama/setup.sh SRC_DIR(tests/llama) WORK CC
# Leaves: WORK/npm/node_modules/..., WORK/bins (link to the shipped .so
# files and CPU backends), WORK/include (llama.h, ggml*.h from the llama.cpp
# git bundle inside the same npm package), WORK/llama-gen, WORK/llama-ref.
set -eu
src=$(cd "$1" && pwd)
mkdir -p "$2"; work=$(cd "$2" && pwd)
cc=${3:-cc}

# The prebuilt binaries of the compiler's target: linux-x64, or linux-arm64
# for the arm64 cross build (tests/vm runs those in an arm64 guest).
case $("$cc" -dumpmachine) in
  aarch64-*) platform=linux-arm64 ;;
  x86_64-*) platform=linux-x64 ;;
  *) echo "setup: no prebuilt llama.cpp for $("$cc" -dumpmachine)" >&2; exit 1 ;;
esac

mkdir -p "$work/npm" "$work/include"
cp "$src/package.json" "$src/package-lock.json" "$work/npm/"
# SKIP_DOWNLOAD: the binaries come from @node-llama-cpp/$platform; never build
# or download llama.cpp at install time.
# `npm ci` refuses this lock: node-llama-cpp 3.22.1 lists optional platform
# packages (win-x64, mac-x64, linux-riscv64 ...) at versions the registry
# does not have (404), so they cannot be in the lock. `npm install` with the
# committed lock installs exactly the locked versions; we check it did not
# have to change the lock, which is what `npm ci` would guarantee.
if [ ! -f "$work/npm/.installed" ] || ! cmp -s "$src/package-lock.json" "$work/npm/.installed"; then
  # --os/--cpu: the lock's direct dependency is the linux-x64 package, which
  # npm refuses to install on another CPU (an arm64 Debian or Pi OS host)
  # unless told which platform to install for; the target's own package
  # follows below.
  (cd "$work/npm" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --os=linux --cpu=x64 --no-audit \
     --no-fund --loglevel=error)
  if ! cmp -s "$src/package-lock.json" "$work/npm/package-lock.json"; then
    echo "setup: npm changed package-lock.json: the registry no longer serves the locked versions" >&2
    exit 1
  fi
  cp "$src/package-lock.json" "$work/npm/.installed"
fi
# Another platform's package is in the lock (an optional dependency of
# node-llama-cpp, with its integrity); npm installs it for that CPU without
# saving, at the locked version, and must leave the lock as it was.
if [ "$platform" != linux-x64 ] && [ ! -d "$work/npm/node_modules/@node-llama-cpp/$platform" ]; then
  version=$(sed -n 's/.*"@node-llama-cpp\/linux-x64": "\(.*\)".*/\1/p' "$src/package.json")
  (cd "$work/npm" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-save --os=linux --cpu="${platform#linux-}" \
     --no-audit --no-fund --loglevel=error "@node-llama-cpp/$platform@$version")
  if ! cmp -s "$src/package-lock.json" "$work/npm/package-lock.json"; then
    echo "setup: npm changed package-lock.json installing @node-llama-cpp/$platform" >&2
    exit 1
  fi
fi

bins="$work/npm/node_modules/@node-llama-cpp/$platform/bins/$platform"
bundle="$work/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle"
[ -f "$bins/libllama.v0.5.0.so" ] || { echo "setup: $bins/libllama.v0.5.0.so missing (npm package layout changed?)" >&2; exit 1; }
[ -f "$bundle" ] || { echo "setup: $bundle missing" >&2; exit 1; }
ln -sfn "$bins" "$work/bins"

# The headers of exactly the llama.cpp these binaries were built from.
for h in include/llama.h ggml/include/ggml.h ggml/include/ggml-backend.h ggml/include/ggml-alloc.h \
         ggml/include/ggml-cpu.h ggml/include/ggml-opt.h ggml/include/gguf.h; do
  git --git-dir="$bundle" show "HEAD:$h" > "$work/include/$(basename "$h")" 2>/dev/null || {
    # A bundle is not a repository: clone it once (no checkout) to read files.
    [ -d "$work/llama-src" ] || git clone -q --no-checkout "$bundle" "$work/llama-src"
    git -C "$work/llama-src" show "HEAD:$h" > "$work/include/$(basename "$h")"
  }
done

"$cc" -std=c11 -O2 -Wall -Wextra -Werror -I"$work/include" "$src/llama_gen.c" -o "$work/llama-gen.tmp" \
  "$bins/libllama.v0.5.0.so" "$bins/libggml.v0.5.0.so" "$bins/libggml-base.so" -Wl,-rpath,"$bins"
mv "$work/llama-gen.tmp" "$work/llama-gen"
"$cc" -std=c11 -O2 -Wall -Wextra -Werror -I"$work/include" "$src/llama_ref.c" -o "$work/llama-ref.tmp" \
  "$bins/libllama.v0.5.0.so" "$bins/libggml.v0.5.0.so" "$bins/libggml-base.so" -Wl,-rpath,"$bins"
mv "$work/llama-ref.tmp" "$work/llama-ref"
echo "setup: llama-gen ready in $work (llama.cpp from npm @node-llama-cpp/$platform)"
