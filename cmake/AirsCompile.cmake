# SPDX-License-Identifier: Apache-2.0
# Warnings, sanitizers and the helper every target uses.
set(AIRS_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wconversion -Wsign-conversion
    -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
# A unity build includes each source into one generated file, so GCC takes a
# test fixture in an anonymous namespace for one declared in a header and
# warns (-Wsubobject-linkage); in a unity build that warning says nothing.
if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  list(APPEND AIRS_WARNINGS -Wno-subobject-linkage)
endif()
if(AIRS_WERROR)
  list(APPEND AIRS_WARNINGS -Werror)
endif()

if(AIRS_SANITIZE)
  string(REPLACE "," ";" _san "${AIRS_SANITIZE}")
  list(JOIN _san "," _san_flag)
  add_compile_options(-fsanitize=${_san_flag} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_san_flag})
endif()

add_compile_options(-fstack-protector-strong)
add_compile_definitions($<$<NOT:$<CONFIG:Debug>>:_FORTIFY_SOURCE=2>)

# airs_target(NAME): apply project warnings to one of our own targets (not to
# generated or third-party code).
function(airs_target name)
  target_compile_options(${name} PRIVATE ${AIRS_WARNINGS})
endfunction()

# airs_hot(NAME): code whose tests are bound by its own arithmetic (the
# engine's kernels, the GGUF parser and writer, the fuzzer) builds at -O1 in a
# sanitizer's Debug build, the level the sanitizers' authors advise; the
# rest of such a build stays at -O0, which compiles in about half the time
# (the heaviest daemon unit under ASan+UBSan: 22 s at -O0, 50 s at -O1) and
# whose code waits on the kernel, the bus and the disk anyway.
function(airs_hot name)
  if(AIRS_SANITIZE)
    target_compile_options(${name} PRIVATE $<$<CONFIG:Debug>:-O1>)
  endif()
endfunction()
