# The library's one version label: `cmake -DSRC=<source root> -P check-version.cmake` fails when
# conflux.h's CFX_VERSION_* do not name the newest symbol-version node of capi/conflux.map (the
# version is that of the newest node: docs/c-api.md), when CFX_VERSION_NUMBER disagrees with them,
# or when the LuaRocks spec (lua/conflux-<version>-1.rockspec) names another version. CMake's
# project() version is checked against the header at configure time (CMakeLists.txt); the Python,
# Java and Lua tests compare the bindings' version() with it.
file(READ ${SRC}/capi/include/conflux/conflux.h header)
foreach(part MAJOR MINOR PATCH NUMBER)
  if(NOT header MATCHES "#define CFX_VERSION_${part} ([0-9]+)")
    message(FATAL_ERROR "conflux.h has no CFX_VERSION_${part}")
  endif()
  set(${part} ${CMAKE_MATCH_1})
endforeach()

file(STRINGS ${SRC}/capi/conflux.map nodes REGEX "^CONFLUX_[0-9]+\\.[0-9]+ *\\{")
list(TRANSFORM nodes REPLACE "^CONFLUX_([0-9]+\\.[0-9]+).*" "\\1")
list(GET nodes -1 newest)
if(NOT "${MAJOR}.${MINOR}" STREQUAL newest)
  message(FATAL_ERROR "conflux.h says version ${MAJOR}.${MINOR}.${PATCH}, but the newest version "
                      "node of capi/conflux.map is CONFLUX_${newest}: the version names the newest node")
endif()
math(EXPR expected "${MAJOR} * 10000 + ${MINOR} * 100 + ${PATCH}")
if(NOT NUMBER EQUAL expected)
  message(FATAL_ERROR "CFX_VERSION_NUMBER is ${NUMBER}, CFX_VERSION_${MAJOR}.${MINOR}.${PATCH} make ${expected}")
endif()
set(version ${MAJOR}.${MINOR}.${PATCH})
set(rockspec ${SRC}/lua/conflux-${version}-1.rockspec)
if(NOT EXISTS ${rockspec})
  file(GLOB found ${SRC}/lua/*.rockspec)
  message(FATAL_ERROR "no ${rockspec} for version ${version} (found: ${found})")
endif()
file(READ ${rockspec} spec)
if(NOT spec MATCHES "version = \"${version}-1\"")
  message(FATAL_ERROR "${rockspec} does not say version = \"${version}-1\"")
endif()
message(STATUS "version ${version}: the newest node CONFLUX_${newest}, number ${NUMBER}, rockspec agree")
