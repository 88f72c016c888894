# SPDX-License-Identifier: Apache-2.0
# Cross-compiling for arm64 (aarch64) with Debian's cross toolchain
# (crossbuild-essential-arm64) and multiarch :arm64 -dev packages, which
# live in /usr/lib/aarch64-linux-gnu beside the build machine's own.
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=packaging/toolchain-aarch64.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Install into the multiarch directory, as a native Debian build does:
# GNUInstallDirs picks lib/<triplet> only when not cross-compiling, and an
# arm64 libairs-dev with airs.pc in /usr/lib/pkgconfig is invisible to a
# cross pkg-config (lintian: pkg-config-unavailable-for-cross-compilation);
# libairs.so.0 and the preload shim belong in /usr/lib/aarch64-linux-gnu too.
# STRING, not PATH: a relative PATH entry given as -D is made absolute
# against the build directory (which put the libraries under it).
set(CMAKE_INSTALL_LIBDIR lib/${CMAKE_LIBRARY_ARCHITECTURE} CACHE STRING "object code libraries (Debian multiarch)")

# No separate sysroot: Debian multiarch. Libraries and CMake package files
# are found under /usr/lib/aarch64-linux-gnu (CMAKE_LIBRARY_ARCHITECTURE),
# headers in /usr/include, and programs (sdbus-c++-xml2cpp) are the build
# machine's own /usr/bin ones.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config: only the arm64 .pc files (and the arch-independent ones).
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Test executables (gtest discovery at build time, ctest) run under
# qemu-user. No -L prefix: the :arm64 packages put the arm64 loader and
# libraries at their multiarch paths (/lib/ld-linux-aarch64.so.1,
# /usr/lib/aarch64-linux-gnu), and taking the loader from the cross
# toolchain's /usr/aarch64-linux-gnu instead would pair it with the newer
# libc6:arm64 (glibc insists loader and libc are the same build).
find_program(AIRS_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${AIRS_QEMU_AARCH64})

# The .deb's architecture.
set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)
