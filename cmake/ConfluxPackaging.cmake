# How Conflux is packaged for each ecosystem, from the one version (project(Conflux VERSION ...)):
#   pip       pyproject.toml + conflux_build_backend.py (a CMake-driven PEP 517 backend)
#   LuaRocks  lua/conflux-<version>-1.rockspec
#   Maven     <build>/maven, staged here: `mvn -o -f <build>/maven/pom.xml install`
#   Debian    CPack's DEB generator, set up here: `cpack -G DEB` in a build configured with
#             -DCMAKE_INSTALL_PREFIX=/usr, one package per install component. Depends come from
#             dpkg-shlibdeps (libconflux1) and the lists below; a CUDA build's libconflux1 also
#             needs CUDA's and NCCL's libraries, which are not Debian packages (no Depends names
#             them): configure with -DCONFLUX_WITH_CUDA=OFF -DCONFLUX_WITH_NCCL=OFF for packages
#             that need Debian's alone.
# Included once, at the end of the top-level CMakeLists.txt (after every part's install rules).

# ---- Maven: a standard project laid out from the CMake build (java/pom.xml.in) ----
if(TARGET conflux_jar AND TARGET conflux_jni)
  set(CONFLUX_MAVEN_DIR ${CMAKE_BINARY_DIR}/maven)
  set(CONFLUX_JAVA_VERSION ${PROJECT_VERSION})
  configure_file(${PROJECT_SOURCE_DIR}/java/pom.xml.in ${CONFLUX_MAVEN_DIR}/pom.xml @ONLY)
  # Maven reads .mvn/maven.config of the project: offline, and the file:// repository (Debian's)
  # still reachable offline
  file(CONFIGURE OUTPUT ${CONFLUX_MAVEN_DIR}/.mvn/maven.config CONTENT "-o -Daether.offline.protocols=file\n")
  get_target_property(_cfx_java_gen conflux_jni SWIG_SUPPORT_FILES_DIRECTORY)
  string(TOLOWER "${CMAKE_SYSTEM_NAME}-${CMAKE_SYSTEM_PROCESSOR}" _cfx_platform)
  string(REPLACE "amd64" "x86_64" _cfx_platform "${_cfx_platform}")
  add_custom_target(conflux_maven_project ALL
    COMMAND ${CMAKE_COMMAND} -DOUT=${CONFLUX_MAVEN_DIR}
            -DMAIN=${PROJECT_SOURCE_DIR}/java/src/main/java -DTEST=${PROJECT_SOURCE_DIR}/java/src/test/java
            -DGEN=${_cfx_java_gen} -DPLATFORM=${_cfx_platform}
            "-DLIBS=$<TARGET_SONAME_FILE:conflux>$<SEMICOLON>$<TARGET_FILE:conflux_jni>"
            -P ${PROJECT_SOURCE_DIR}/java/cmake/StageMaven.cmake
    COMMENT "Staging the Maven project in ${CONFLUX_MAVEN_DIR}" VERBATIM)
  add_dependencies(conflux_maven_project conflux_jar)
endif()

# ---- Debian packages (CPack DEB): component -> package ----
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME conflux)
set(CPACK_PACKAGE_VENDOR "Conflux")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Conflux maintainers <conflux@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})   # the prefix the build recorded
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)                       # <name>_<version>-<release>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://localhost/conflux")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS OFF)
set(_cfx_deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")
set(_cfx_lib_dep "libconflux${CONFLUX_ABI_VERSION} (= ${_cfx_deb_version})")

# cfx_deb(COMPONENT PACKAGE SECTION DEPENDS DESCRIPTION): one binary package (the description's first
# line is its synopsis).
set(CPACK_COMPONENTS_ALL "")
macro(cfx_deb comp pkg section depends summary)
  string(TOUPPER ${comp} _u)
  list(APPEND CPACK_COMPONENTS_ALL ${comp})
  set(CPACK_DEBIAN_${_u}_PACKAGE_NAME ${pkg})
  set(CPACK_DEBIAN_${_u}_PACKAGE_SECTION ${section})
  set(CPACK_DEBIAN_${_u}_PACKAGE_DEPENDS "${depends}")
  set(CPACK_DEBIAN_${_u}_DESCRIPTION "${summary}")
endmacro()

cfx_deb(runtime libconflux${CONFLUX_ABI_VERSION} libs ""
  "Conflux: data-parallel training communication library\nConflux agrees with the other workers of a job on which tensors are ready, fuses\nthem and reduces them (Open MPI on CPU memory, NCCL on GPU memory), behind a\nstable C ABI. This package holds the shared library.")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)                # libc6, libopenmpi3, ... from the ELF
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)                  # DEBIAN/shlibs of libconflux1
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")         # the ABI is stable within a SONAME
cfx_deb(dev libconflux-dev libdevel "${_cfx_lib_dep}"
  "Conflux: development files\nThe C header conflux/conflux.h, the libconflux.so link, the CMake package\n(find_package(Conflux), Conflux::conflux), conflux.pc and the documentation.")
cfx_deb(tools conflux-tools utils "python3, openmpi-bin"
  "Conflux: job tools\ncfxrun starts a Conflux job over Open MPI's mpirun; cfx-timeline merges and\nsummarises the timelines a job writes.")
set(CPACK_DEBIAN_TOOLS_PACKAGE_SUGGESTS python3-matplotlib)
if(TARGET cfx_python)
  # the interpreter the module was built for, from its suffix (.cpython-311-x86_64-linux-gnu.so)
  get_target_property(_cfx_py_suffix cfx_python SUFFIX)
  set(_cfx_py_deps "")
  if(_cfx_py_suffix MATCHES "cpython-3([0-9]+)")
    math(EXPR _cfx_py_next "${CMAKE_MATCH_1} + 1")
    set(_cfx_py_deps "python3 (>= 3.${CMAKE_MATCH_1}~), python3 (<< 3.${_cfx_py_next}), ")
  endif()
  cfx_deb(python python3-conflux python "${_cfx_lib_dep}, ${_cfx_py_deps}python3-numpy"
    "Conflux for Python 3\nThe conflux package: collectives on NumPy arrays, conflux.torch for PyTorch\n(DistributedOptimizer, the torch.distributed backend) and a Horovod-compatible\nconflux.horovod.torch. conflux.torch needs torch 2.13 or newer from PyPI (pip install\ntorch==2.15.0, the version it is built and tested with); Debian 12's python3-torch 1.13\nis not supported.")
endif()
if(TARGET conflux_jar)
  cfx_deb(java libconflux-java java
    "${_cfx_lib_dep}, default-jre-headless (>= 2:1.17) | java17-runtime-headless"
    "Conflux for Java\nThe org.conflux package (conflux.jar, its pom) and its JNI library\nlibconflux_jni.so.")
endif()
if(TARGET cfx_lua)
  cfx_deb(lua lua-conflux interpreters "${_cfx_lib_dep}, lua5.4"
    "Conflux for Lua 5.4\nThe conflux module: collectives on Lua tables and typed arrays, async handles.")
endif()
include(CPack)
