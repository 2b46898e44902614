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
# The job tools keep their layout (cfx-timeline imports the cfx_timeline package beside it) in
# <datadir>/conflux/tools; <bindir> has links to them.
set(_cfx_tools_dest ${CMAKE_INSTALL_DATADIR}/conflux/tools)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/cfxrun ${PROJECT_SOURCE_DIR}/tools/cfx-timeline
        DESTINATION ${_cfx_tools_dest} COMPONENT tools)
# The store cfxrun serves, beside it (the cfx-store tool it starts goes to <bindir>: tools/).
install(FILES ${PROJECT_SOURCE_DIR}/tools/cfx_store.py DESTINATION ${_cfx_tools_dest} COMPONENT tools)
if(EXISTS ${PROJECT_SOURCE_DIR}/tools/cfx_timeline)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/tools/cfx_timeline DESTINATION ${_cfx_tools_dest} COMPONENT tools
          FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
endif()
file(RELATIVE_PATH _cfx_tools_rel ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_PREFIX}/${_cfx_tools_dest})
file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/tool-links)
foreach(_tool cfxrun cfx-timeline)
  file(CREATE_LINK ${_cfx_tools_rel}/${_tool} ${PROJECT_BINARY_DIR}/tool-links/${_tool} SYMBOLIC)
  install(FILES ${PROJECT_BINARY_DIR}/tool-links/${_tool} DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
endforeach()
