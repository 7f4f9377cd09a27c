# Run by `cmake --install` (install(CODE) in CMakeLists.txt), so that the files that name
# installed paths -- the systemd units, the pkg-config file -- and the sample configuration
# follow the prefix given at install time (`cmake --install build --prefix /usr`), not only the
# one the build was configured with. Honours DESTDIR, as file(INSTALL) does.
#
# In: WXG_PART (runtime: the units, the configuration; dev: the pkg-config file), WXG_SRC (the
# source tree), WXG_BIN (the build tree), WXG_VERSION, WXG_CONTACT (the packages' maintainer),
# WXG_UNITDIR (relative to the prefix or absolute), and the install-time CMAKE_INSTALL_PREFIX.
set(prefix "${CMAKE_INSTALL_PREFIX}")
# As GNUInstallDirs decides it: the system's /etc for the /usr prefix, else under the prefix.
if(prefix STREQUAL "/usr")
  set(sysconf "/etc")
else()
  set(sysconf "${prefix}/etc")
endif()
set(WXG_BINDIR "${prefix}/bin")
set(WXG_CONFDIR "${sysconf}/wxguard")
set(WXG_DOCDIR "${prefix}/share/doc/wxguard")
set(WXG_PC_INCLUDEDIR "${prefix}/include")
if(IS_ABSOLUTE "${WXG_UNITDIR}")
  set(unitdir "${WXG_UNITDIR}")
else()
  set(unitdir "${prefix}/${WXG_UNITDIR}")
endif()
set(out "${WXG_BIN}/install-paths")
if(WXG_PART STREQUAL "runtime")
  foreach(unit wxguard-consumer@.service wxguard-ingest.service)
    configure_file("${WXG_SRC}/deploy/systemd/${unit}.in" "${out}/${unit}" @ONLY)
    file(INSTALL "${out}/${unit}" DESTINATION "${unitdir}")
  endforeach()
  file(INSTALL "${WXG_SRC}/deploy/config/consumer.properties"
               "${WXG_SRC}/deploy/config/ingest.properties" DESTINATION "${WXG_CONFDIR}")
  set(pkg wxguard)
  # The upstream changelog under the name Debian's policy gives it.
  file(COPY "${WXG_SRC}/CHANGELOG.md" DESTINATION "${out}")
  file(RENAME "${out}/CHANGELOG.md" "${out}/changelog")
  execute_process(COMMAND gzip -9nf "${out}/changelog" RESULT_VARIABLE gz)
  if(NOT gz EQUAL 0)
    message(FATAL_ERROR "gzip failed on ${out}/changelog")
  endif()
  file(INSTALL "${out}/changelog.gz" DESTINATION "${prefix}/share/doc/wxguard")
else()
  configure_file("${WXG_SRC}/deploy/pkgconfig/wxguard-plugin.pc.in" "${out}/wxguard-plugin.pc"
                 @ONLY)
  file(INSTALL "${out}/wxguard-plugin.pc" DESTINATION "${prefix}/share/pkgconfig")
  set(pkg wxguard-dev)
endif()
# Each package's copyright and Debian changelog, where Debian's policy puts them.
configure_file("${WXG_SRC}/deploy/debian/changelog.in" "${out}/${pkg}/changelog.Debian" @ONLY)
execute_process(COMMAND gzip -9nf "${out}/${pkg}/changelog.Debian" RESULT_VARIABLE gz)
if(NOT gz EQUAL 0)
  message(FATAL_ERROR "gzip failed on ${out}/${pkg}/changelog.Debian")
endif()
file(INSTALL "${WXG_SRC}/deploy/debian/copyright" "${out}/${pkg}/changelog.Debian.gz"
     DESTINATION "${prefix}/share/doc/${pkg}")
# Lintian's overrides, each with its reason (deploy/debian/lintian/).
file(INSTALL "${WXG_SRC}/deploy/debian/lintian/${pkg}" DESTINATION "${prefix}/share/lintian/overrides")
