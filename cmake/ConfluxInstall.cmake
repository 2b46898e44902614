# Install rules: the library, its one header, ConfluxConfig.cmake (Conflux::conflux) and conflux.pc.
include(CMakePackageConfigHelpers)
install(TARGETS conflux EXPORT ConfluxTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/capi/include/conflux DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT ConfluxTargets NAMESPACE Conflux:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Conflux)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ConfluxConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ConfluxConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Conflux)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ConfluxConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ConfluxConfig.cmake ${PROJECT_BINARY_DIR}/ConfluxConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Conflux)
# The .pc file finds the prefix relative to itself, so an installed tree can be moved.
file(RELATIVE_PATH CFX_PC_PREFIX_REL ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
configure_file(${PROJECT_SOURCE_DIR}/cmake/conflux.pc.in ${PROJECT_BINARY_DIR}/conflux.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/conflux.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
