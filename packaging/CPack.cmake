# The Debian package: `cpack -G DEB` in the build directory gives
# airs-memd_<version>_<arch>.deb. Configure with -DCMAKE_INSTALL_PREFIX=/usr
# (the unit's ExecStart is /usr/sbin/airs-memd).
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "airs-memd: CMAKE_INSTALL_PREFIX is ${CMAKE_INSTALL_PREFIX}; "
                 "the .deb and the systemd unit expect /usr (-DCMAKE_INSTALL_PREFIX=/usr)")
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME airs-memd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "airs-memd maintainers <airs@localhost>")
set(CPACK_PACKAGE_VENDOR "AIOS")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "huge-page model memory manager for on-device LLM inference")
set(CPACK_PACKAGE_DESCRIPTION
    "airs-memd keeps LLM weights and paged KV caches in pinned huge-page memory,
loads GGUF models lazily (userfaultfd + io_uring), shares them between
inference processes over D-Bus (org.aios.Airs1) and gives memory back to the
system under pressure (PSI). Includes airsctl.")
# DESTDIR install: /etc/airs is an absolute destination.
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)   # airs-memd_<ver>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
if(NOT CPACK_DEBIAN_PACKAGE_ARCHITECTURE)  # the arm64 toolchain file sets it
  execute_process(COMMAND dpkg --print-architecture OUTPUT_VARIABLE CPACK_DEBIAN_PACKAGE_ARCHITECTURE
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
# Library dependencies from the binaries (dpkg-shlibdeps), plus what the
# maintainer scripts and the unit use.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "dbus (>= 1.12), systemd (>= 247), procps")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "udev")

set(_airs_deb ${CMAKE_CURRENT_LIST_DIR}/debian)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${_airs_deb}/conffiles ${_airs_deb}/postinst ${_airs_deb}/prerm ${_airs_deb}/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
