# SPDX-License-Identifier: Apache-2.0
# System integration: where `cmake --install` (prefix /usr) and the .deb put
# the unit, bus policy, activation file, sysusers/tmpfiles/udev/sysctl
# files, the man pages and the configuration, at the paths Debian expects;
# then the CPack configuration and the systemd/packaging tests.
# Included once from the top-level CMakeLists.txt, after add_subdirectory(tests).
#
#   cmake -S . -B build -DCMAKE_INSTALL_PREFIX=/usr
#   cmake --build build && cmake --install build      # or: cpack -G DEB
set(_airs_sd ${PROJECT_SOURCE_DIR}/systemd)

# Under the prefix (/usr): these paths are fixed by systemd, D-Bus and udev,
# not by GNUInstallDirs (whose LIBDIR is multiarch on Debian).
install(FILES ${_airs_sd}/airs-memd.service DESTINATION lib/systemd/system)
# The huge-folio tmpfs for the shmem pool, on kernels with transparent huge
# pages only (the generator says why it is not a line of the unit).
install(PROGRAMS ${_airs_sd}/airs-memd-generator DESTINATION lib/systemd/system-generators)
install(FILES ${_airs_sd}/org.aios.Airs1.conf DESTINATION share/dbus-1/system.d)
install(FILES ${_airs_sd}/org.aios.Airs1.service DESTINATION share/dbus-1/system-services)
install(FILES ${_airs_sd}/sysusers.d/airs.conf DESTINATION lib/sysusers.d)
install(FILES ${_airs_sd}/tmpfiles.d/airs.conf DESTINATION lib/tmpfiles.d)
install(FILES ${_airs_sd}/udev/60-airs-userfaultfd.rules DESTINATION lib/udev/rules.d)
# The boot-time pool is sized per machine: a fixed vm.nr_hugepages in
# /usr/lib/sysctl.d would be applied on every machine the package lands on
# (2048 pages = 4 GiB on a 4 GB Pi, or 64 GiB with 32 MiB pages). So the
# 8 GB-profile file is shipped as a template, and the package's postinst
# writes /etc/sysctl.d/60-airs-memd.conf sized from MemTotal and the huge
# page size (docs/boot.md).
install(FILES ${_airs_sd}/sysctl.d/60-airs-memd.conf DESTINATION share/airs-memd/sysctl.d)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION share/doc/airs-memd)
if(EXISTS ${PROJECT_SOURCE_DIR}/docs/boot.md)
  install(FILES ${PROJECT_SOURCE_DIR}/docs/boot.md DESTINATION share/doc/airs-memd)
endif()
# Man pages, hand-written roff (docs/man; tests/unit/man keeps them honest),
# gzipped as Debian policy wants them (-n: no name or time stamp, so the
# packages are reproducible); the Debian changelog likewise.
set(_airs_man ${PROJECT_SOURCE_DIR}/docs/man)
set(_airs_gz_dir ${PROJECT_BINARY_DIR}/packaging)
set(AIRS_DEB_VERSION ${PROJECT_VERSION}-1)   # CPACK_DEBIAN_PACKAGE_RELEASE 1
set(AIRS_DEB_MAINTAINER "airs-memd maintainers <maintainers@users.noreply.a-seed-70fc2f03.example>")
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/changelog.in ${_airs_gz_dir}/changelog.Debian @ONLY)
set(_airs_gz)
foreach(src ${_airs_man}/airsctl.1 ${_airs_man}/airs-run.1 ${_airs_man}/airs-generate.1 ${_airs_man}/libairs.3 ${_airs_man}/airs-memd.conf.5 ${_airs_man}/airs-memd.8
            ${_airs_gz_dir}/changelog.Debian)
  get_filename_component(_name ${src} NAME)
  add_custom_command(OUTPUT ${_airs_gz_dir}/${_name}.gz
    COMMAND sh -c "gzip -n9 -c '${src}' >'${_airs_gz_dir}/${_name}.gz'"
    DEPENDS ${src} VERBATIM)
  list(APPEND _airs_gz ${_airs_gz_dir}/${_name}.gz)
endforeach()
add_custom_target(airs-package-docs ALL DEPENDS ${_airs_gz})
# Everything the packages hold: `cmake --build build --target airs-package`
# before cpack (scripts/e2e.sh, tests/e2e).
add_custom_target(airs-package)
add_dependencies(airs-package airs-package-docs airs-memd airsctl airs airs-preload airs-demo airs-mkmodel airs-generate)

# Component "Unspecified" (install rules without COMPONENT: the daemon,
# airsctl, the tools, units, policy, configuration) is the airs-memd
# package; "lib" is libairs0 and "dev" is libairs-dev (packaging/CPack.cmake).
install(FILES ${_airs_gz_dir}/airsctl.1.gz ${_airs_gz_dir}/airs-run.1.gz ${_airs_gz_dir}/airs-generate.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${_airs_gz_dir}/airs-memd.conf.5.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man5)
install(FILES ${_airs_gz_dir}/airs-memd.8.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
install(FILES ${_airs_gz_dir}/libairs.3.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man3 COMPONENT dev)
# Every package: /usr/share/doc/<package>/{copyright,changelog.Debian.gz} and
# its lintian overrides (each with its reason). The licence reaches each
# package as its copyright file, which points at Debian's own copy of the
# Apache-2.0 text: the top-level LICENSE installed next to it would be the
# same text twice (lintian: extra-license-file).
foreach(pair "Unspecified;airs-memd" "lib;libairs0" "dev;libairs-dev")
  list(GET pair 0 _comp)
  list(GET pair 1 _pkg)
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/copyright ${_airs_gz_dir}/changelog.Debian.gz
          DESTINATION share/doc/${_pkg} COMPONENT ${_comp})
  if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/debian/lintian/${_pkg})
    install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/lintian/${_pkg} DESTINATION share/lintian/overrides COMPONENT ${_comp})
  endif()
endforeach()

# /etc (CMAKE_INSTALL_FULL_SYSCONFDIR is /etc when the prefix is /usr).
install(FILES ${PROJECT_SOURCE_DIR}/config/airs-memd.conf DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/airs)
install(DIRECTORY DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/airs/airs-memd.conf.d)

include(${CMAKE_CURRENT_LIST_DIR}/CPack.cmake)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/airs-run DESTINATION ${CMAKE_INSTALL_BINDIR})
