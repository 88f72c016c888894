#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The three Debian packages (packaging/CPack.cmake), built and checked:
#   packages.sh build BUILD_DIR  builds the packaged targets and runs cpack
#                                into BUILD_DIR/packages (a ctest fixture)
#   packages.sh lint BUILD_DIR [DEB_DIR]
#                                lintian on airs-memd, libairs0, libairs-dev
#                                (in DEB_DIR, default BUILD_DIR/packages; the
#                                arm64 build's cpack writes into build-arm64/
#                                itself, scripts/cross-arm64.sh): fails on any
#                                error or warning (overrides, each with its
#                                reason, are in packaging/debian/lintian/);
#                                prints all tags. lintian checks a .deb of
#                                any architecture on this one.
#   packages.sh dev BUILD_DIR    unpacks libairs0 + libairs-dev (dpkg -x) into
#                                a temporary root and builds a C and a C++
#                                program with nothing but
#                                `pkg-config --cflags --libs airs` pointed
#                                into that root, then runs both against the
#                                unpacked libairs.so.0 (no daemon: each must
#                                get libairs's own "cannot connect" error)
# Exit 77 (skipped, said loudly) when lintian or pkg-config is missing.
set -euo pipefail
mode=$1 build=$(readlink -f "$2")
pkgs=$build/packages
if [[ $mode == lint && -n ${3:-} ]]; then pkgs=$(readlink -f "$3"); fi

debs() {  # the three .debs, or fail
  local n
  for n in airs-memd libairs0 libairs-dev; do
    ls "$pkgs"/${n}_*.deb 2>/dev/null | head -1 | grep . || { echo "no ${n}_*.deb in $pkgs (run: packages.sh build)" >&2; exit 1; }
  done
}

case $mode in
build)
  grep -qx 'CMAKE_INSTALL_PREFIX:PATH=/usr' "$build/CMakeCache.txt" \
    || { echo "the build must use -DCMAKE_INSTALL_PREFIX=/usr for the packages" >&2; exit 1; }
  cmake --build "$build" --target airs-package
  rm -rf "$pkgs"
  (cd "$build" && cpack -G DEB -B "$pkgs" >"$build/cpack.log" 2>&1) || { cat "$build/cpack.log"; exit 1; }
  rm -rf "$pkgs/_CPack_Packages"
  ls -l "$pkgs"
  ;;
lint)
  if ! command -v lintian >/dev/null; then echo "SKIP: lintian is not installed (scripts/deps.sh installs it)"; exit 77; fi
  mapfile -t files < <(debs)
  lintian --version
  for f in "${files[@]}"; do echo "${f##*/}: Architecture $(dpkg-deb --field "$f" Architecture)"; done
  # -I: show info tags too (they do not fail the test); lintian refuses
  # nothing as root, it only warns about it.
  out=$(lintian --tag-display-limit 0 -I --show-overrides "${files[@]}" 2>&1 | grep -v 'running with root privileges' || true)
  echo "$out"
  bad=$(grep -E '^[EW]: ' <<<"$out" || true)
  if [[ -n $bad ]]; then
    echo "FAIL: lintian errors or warnings:"; echo "$bad"; exit 1
  fi
  echo "PASS: lintian: no error, no warning on ${files[*]##*/}"
  ;;
dev)
  if ! command -v pkg-config >/dev/null; then echo "SKIP: pkg-config is not installed"; exit 77; fi
  mapfile -t files < <(debs)
  root=$(mktemp -d); trap 'rm -rf "$root"' EXIT
  dpkg -x "${files[1]}" "$root"
  dpkg -x "${files[2]}" "$root"
  multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -dumpmachine)
  export PKG_CONFIG_SYSROOT_DIR=$root
  export PKG_CONFIG_LIBDIR=$root/usr/lib/$multiarch/pkgconfig   # only the unpacked airs.pc
  cflags=$(pkg-config --cflags airs) libs=$(pkg-config --libs airs)
  echo "pkg-config --cflags --libs airs: $cflags $libs"
  [[ $cflags == *"$root/usr/include"* && $libs == *"-L$root/usr/lib/$multiarch"* ]] \
    || { echo "FAIL: airs.pc does not point into the unpacked root"; exit 1; }
  cat >"$root/consumer.c" <<'C'
#include <airs/airs.h>
#include <stdio.h>
int main(void) {
  airs_client *c = NULL;
  if (airs_connect("unix:path=/nonexistent/airs-dev-test", &c) == 0) { airs_disconnect(c); return 2; }
  printf("C consumer: %s\n", airs_last_error());
  return 0;
}
C
  cat >"$root/consumer.cpp" <<'CPP'
#include <airs/airs.hpp>
#include <iostream>
int main() {
  airs_client* c = nullptr;
  try {
    airs::detail::check(airs_connect("unix:path=/nonexistent/airs-dev-test", &c));
  } catch (const airs::ClientError& e) {
    std::cout << "C++ consumer: " << e.what() << " (" << e.code() << ")\n";
    return e.code() < 0 ? 0 : 3;
  }
  airs_disconnect(c);
  return 2;
}
CPP
  rc=0
  # shellcheck disable=SC2086  # pkg-config's output is a list of flags
  cc -std=c11 -Wall -Wextra -Werror $cflags "$root/consumer.c" -o "$root/consumer-c" $libs || rc=1
  # shellcheck disable=SC2086
  c++ -std=c++20 -Wall -Wextra -Werror $cflags "$root/consumer.cpp" -o "$root/consumer-cpp" $libs || rc=1
  ((rc == 0)) || { echo "FAIL: a consumer did not build from pkg-config's flags"; exit 1; }
  for p in consumer-c consumer-cpp; do
    lib=$(LD_LIBRARY_PATH=$root/usr/lib/$multiarch ldd "$root/$p" | awk '/libairs\.so/ {print $3}')
    [[ $lib == "$root/usr/lib/$multiarch/libairs.so.0" ]] || { echo "FAIL: $p resolves libairs to '$lib'"; rc=1; continue; }
    LD_LIBRARY_PATH=$root/usr/lib/$multiarch "$root/$p" || { echo "FAIL: $p exited $?"; rc=1; }
  done
  ((rc == 0)) && echo "PASS: C (c11) and C++ (c++20) consumers built with pkg-config alone against libairs0 + libairs-dev"
  exit $rc
  ;;
*) echo "usage: $0 build|lint|dev BUILD_DIR" >&2; exit 2 ;;
esac
