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
# Man pages, hand-written roff (docs/man; tests/unit/man keeps them honest).
# Installed uncompressed: man-db reads them as they are.
set(_airs_man ${PROJECT_SOURCE_DIR}/docs/man)
install(FILES ${_airs_man}/airsctl.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${_airs_man}/libairs.3 DESTINATION ${CMAKE_INSTALL_MANDIR}/man3)
install(FILES ${_airs_man}/airs-memd.conf.5 DESTINATION ${CMAKE_INSTALL_MANDIR}/man5)
install(FILES ${_airs_man}/airs-memd.8 DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)

# /etc (CMAKE_INSTALL_FULL_SYSCONFDIR is /etc when the prefix is /usr).
install(FILES ${PROJECT_SOURCE_DIR}/config/airs-memd.conf DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/airs)
install(DIRECTORY DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/airs/airs-memd.conf.d)

include(${CMAKE_CURRENT_LIST_DIR}/CPack.cmake)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/airs-run DESTINATION ${CMAKE_INSTALL_BINDIR})
