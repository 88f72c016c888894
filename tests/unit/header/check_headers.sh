#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The installed headers compile in every language standard they promise,
# with -pedantic -Wall -Wextra -Werror, alone (nothing else included first):
#   airs/airs.h    as C99, C11, C++17 and C++20 (a C API, used from C++ too)
#   airs/airs.hpp  as C++20; under C++17 its first error is its own #error
#                  saying to use C++20 or airs.h
# Each case also uses a few declarations, so an unparsed #ifdef cannot pass.
#   check_headers.sh CC CXX INCLUDE_DIR
set -euo pipefail
cc=$1 cxx=$2 inc=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failed=0
flags=(-pedantic -Wall -Wextra -Werror -fsyntax-only -I "$inc")
cat >"$tmp/c.c" <<'C'
#include "airs/airs.h"
#include <stddef.h>
int main(void) {
  airs_client *c = NULL;
  const char *e = airs_last_error();
  (void)e;
  return airs_connect("session", &c) < 0 ? 1 : (airs_disconnect(c), 0);
}
C
cp "$tmp/c.c" "$tmp/c_as.cpp"
cat >"$tmp/hpp.cpp" <<'CPP'
#include "airs/airs.hpp"
int main() {
  try { airs::detail::check(-1); } catch (const airs::ClientError& e) { return e.code() == -1 ? 0 : 1; }
  return 1;
}
CPP
check() {  # name, compiler args...
  local name=$1; shift
  if out=$("$@" 2>&1); then echo "PASS: $name"; else echo "FAIL: $name"; echo "$out" | head -20; failed=1; fi
}
for std in c99 c11; do check "airs.h as $std" "$cc" -std=$std "${flags[@]}" "$tmp/c.c"; done
for std in c++17 c++20; do check "airs.h as $std" "$cxx" -std=$std "${flags[@]}" "$tmp/c_as.cpp"; done
check "airs.hpp as c++20" "$cxx" -std=c++20 "${flags[@]}" "$tmp/hpp.cpp"
if out=$("$cxx" -std=c++17 "${flags[@]}" "$tmp/hpp.cpp" 2>&1); then
  echo "FAIL: airs.hpp compiled as c++17 (it uses std::span: the #error guard is gone?)"; failed=1
elif grep -m1 'error' <<<"$out" | grep -q 'airs.hpp needs C++20'; then
  echo "PASS: airs.hpp as c++17: the first error says it needs C++20"
else
  echo "FAIL: airs.hpp as c++17 fails, but its first error is not its own #error:"; echo "$out" | head -10; failed=1
fi
exit $failed
