# SPDX-License-Identifier: Apache-2.0
# The Debian packages: `cpack -G DEB` in the build directory (after
# `cmake --build build --target airs-package`) gives three, split the Debian
# way from one source, airs-memd:
#   airs-memd_<ver>-1_<arch>.deb    the daemon, airsctl, airs-run, the demo
#                                   tools, units, bus policy, configuration
#                                   (install rules without COMPONENT)
#   libairs0_<ver>-1_<arch>.deb     libairs.so.0 (SONAME = ABI major; shlibs
#                                   and the ldconfig trigger generated here)
#                                   and the preload shim (component "lib")
#   libairs-dev_<ver>-1_<arch>.deb  headers, libairs.so, airs.pc, libairs(3)
#                                   (component "dev")
# tests/e2e checks them with lintian (e2e.lintian) and builds C and C++
# programs against an unpacked libairs0 + libairs-dev (e2e.dev).
# Configure with -DCMAKE_INSTALL_PREFIX=/usr (the unit's ExecStart is
# /usr/sbin/airs-memd).
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "airs-memd: CMAKE_INSTALL_PREFIX is ${CMAKE_INSTALL_PREFIX}; "
                 "the .deb and the systemd unit expect /usr (-DCMAKE_INSTALL_PREFIX=/usr)")
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME airs-memd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# The Debian revision: packaging changes without an upstream change bump it
# (and the entry in packaging/debian/changelog.in, AIRS_DEB_VERSION).
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_PACKAGE_CONTACT "${AIRS_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${AIRS_DEB_MAINTAINER}")
set(CPACK_PACKAGE_VENDOR "AIOS")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)   # Apache-2.0; the .debs carry it as debian/copyright
set(CPACK_DEBIAN_PACKAGE_SOURCE airs-memd)
# DESTDIR install: /etc/airs is an absolute destination.
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL Unspecified lib dev)
set(CPACK_COMPONENTS_GROUPING IGNORE)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)   # <package>_<ver>-<rev>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
if(NOT CPACK_DEBIAN_PACKAGE_ARCHITECTURE)  # the arm64 toolchain file sets it
  execute_process(COMMAND dpkg --print-architecture OUTPUT_VARIABLE CPACK_DEBIAN_PACKAGE_ARCHITECTURE
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
# Library dependencies from the binaries (dpkg-shlibdeps). libairs.so.0 is
# in none of the installed packages yet: dpkg-shlibdeps finds it in the
# build tree, and the dependency on it is the explicit one below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/src/client)
set(_airs_lib_dep "libairs0 (= ${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE})")
set(_airs_deb ${CMAKE_CURRENT_LIST_DIR}/debian)

# airs-memd
set(CPACK_DEBIAN_UNSPECIFIED_PACKAGE_NAME airs-memd)
set(CPACK_DEBIAN_UNSPECIFIED_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_UNSPECIFIED_DESCRIPTION
    "huge-page model memory manager for on-device LLM inference
airs-memd keeps LLM weights and paged KV caches in pinned huge-page memory,
loads GGUF models lazily (userfaultfd + io_uring), shares them between
inference processes over D-Bus (org.aios.Airs1) and gives memory back to the
system under pressure (PSI).
.
This package holds the daemon and its systemd unit, D-Bus policy and
configuration, airsctl (the operator's tool), airs-run (runs an unmodified
GGUF runtime on the pool) and the demo tools airs-demo and airs-mkmodel.")
# What the maintainer scripts and the unit use, and libairs0 for airsctl,
# airs-demo and airs-run's preload shim.
set(CPACK_DEBIAN_UNSPECIFIED_PACKAGE_DEPENDS "${_airs_lib_dep}, dbus (>= 1.12), systemd (>= 247), procps")
set(CPACK_DEBIAN_UNSPECIFIED_PACKAGE_RECOMMENDS "udev")
set(CPACK_DEBIAN_UNSPECIFIED_PACKAGE_CONTROL_EXTRA
    ${_airs_deb}/conffiles ${_airs_deb}/postinst ${_airs_deb}/prerm ${_airs_deb}/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

# libairs0
set(CPACK_DEBIAN_LIB_PACKAGE_NAME libairs0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIB_DESCRIPTION
    "client library of airs-memd (lazy shared model mappings, paged KV)
libairs maps models held by airs-memd lazily (userfaultfd), shares them
between processes and manages paged KV-cache blocks over D-Bus. The
package also holds libairs-preload.so, the shim airs-run preloads to run an
unmodified GGUF runtime on the airs-memd pool.")
# shlibs ("libairs 0 libairs0 (>= <ver>)"; CPack generates it for every
# package, and only libairs0 has a library with a SONAME) and the ldconfig
# trigger (packaging/debian/triggers), which replaces the ldconfig calls
# CPack would write into a generated postinst and postrm (lintian:
# maintscript-calls-ldconfig). CPack generates them unless CONTROL_EXTRA
# names a postinst and a postrm: the two "none/" paths do not exist, so the
# package has no maintainer scripts (cpack prints "Adding file to tar"
# for each).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${_airs_deb}/triggers ${_airs_deb}/none/postinst ${_airs_deb}/none/postrm)

# libairs-dev
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libairs-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_ARCHITECTURE ${CPACK_DEBIAN_PACKAGE_ARCHITECTURE})
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "client library of airs-memd - development files
The C header airs/airs.h (C99 or later, also from C++17), the C++ wrapper
airs/airs.hpp (C++20), the libairs.so link, the pkg-config file airs.pc and
the libairs(3) manual page.")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${_airs_lib_dep}")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)

include(CPack)
