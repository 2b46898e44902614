# Install rules: the library, its one header, ConfluxConfig.cmake (Conflux::conflux), conflux.pc and
# the job tools. Components (packages in cmake/ConfluxPackaging.cmake; the bindings add theirs):
#   runtime  libconflux.so.<ABI> and its SONAME link                       (libconflux1)
#   dev      header, libconflux.so link, CMake config, pkg-config, docs    (libconflux-dev)
#   tools    cfxrun, cfx-timeline                                          (conflux-tools)
include(CMakePackageConfigHelpers)
install(TARGETS conflux EXPORT ConfluxTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/capi/include/conflux DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev)
install(EXPORT ConfluxTargets NAMESPACE Conflux:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Conflux
        COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ConfluxConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ConfluxConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Conflux)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ConfluxConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ConfluxConfig.cmake ${PROJECT_BINARY_DIR}/ConfluxConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Conflux COMPONENT dev)
# The .pc file finds the prefix relative to itself, so an installed tree can be moved.
file(RELATIVE_PATH CFX_PC_PREFIX_REL ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
configure_file(${PROJECT_SOURCE_DIR}/cmake/conflux.pc.in ${PROJECT_BINARY_DIR}/conflux.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/conflux.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)
# The documentation, as the C developer's package carries it.
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT dev
        FILES_MATCHING PATTERN "*.md")
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/cfxrun ${PROJECT_SOURCE_DIR}/tools/cfx-timeline
        DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
