# Run by `cmake --install` (install(CODE) in CMakeLists.txt), so that the files that name
# installed paths -- the systemd units, the pkg-config file -- and the sample configuration
# follow the prefix given at install time (`cmake --install build --prefix /usr`), not only the
# one the build was configured with. Honours DESTDIR, as file(INSTALL) does.
#
# In: WXG_SRC (the source tree), WXG_BIN (the build tree), WXG_VERSION, WXG_UNITDIR (relative
# to the prefix or absolute), and the install-time CMAKE_INSTALL_PREFIX.
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
foreach(unit wxguard-consumer@.service wxguard-ingest.service)
  configure_file("${WXG_SRC}/deploy/systemd/${unit}.in" "${out}/${unit}" @ONLY)
  file(INSTALL "${out}/${unit}" DESTINATION "${unitdir}")
endforeach()
configure_file("${WXG_SRC}/deploy/pkgconfig/wxguard-plugin.pc.in" "${out}/wxguard-plugin.pc" @ONLY)
file(INSTALL "${out}/wxguard-plugin.pc" DESTINATION "${prefix}/share/pkgconfig")
file(INSTALL "${WXG_SRC}/deploy/config/consumer.properties"
             "${WXG_SRC}/deploy/config/ingest.properties" DESTINATION "${WXG_CONFDIR}")
