# ConfluxCuda: the CUDA kernels and the NCCL data path (capi/src/cuda/) as the static PIC library
# `conflux_cuda`, per CONFLUX_WITH_CUDA / CONFLUX_WITH_NCCL (AUTO|ON|OFF).
#
# Include it once from the top-level scope (cmake/ConfluxDeps.cmake), before add_subdirectory(capi).
# It sets CONFLUX_WITH_CUDA_ENABLED and CONFLUX_WITH_NCCL_ENABLED and, when CUDA is enabled, defines
# `conflux_cuda`, whose INTERFACE carries CFX_HAVE_CUDA=1 / CFX_HAVE_NCCL=0|1 and the CUDA runtime
# (and NCCL) link, so the engine gets them by linking it. Without CUDA (not found, or OFF) it
# defines nothing else and never enables the CUDA language: including it is harmless.
#
# Architectures: CMAKE_CUDA_ARCHITECTURES, default SASS for 70 75 80 86 89 and SASS+PTX for 90 (the
# PTX lets newer GPUs JIT), minus what this nvcc cannot build (nvcc 13 starts at compute_75).
include_guard(GLOBAL)

set(CONFLUX_WITH_CUDA_ENABLED OFF)
set(CONFLUX_WITH_NCCL_ENABLED OFF)

if(NOT CONFLUX_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
endif()

# A CUDA compiler: the one CMake finds (PATH, CUDACXX, -DCMAKE_CUDA_COMPILER), else the toolkit's nvcc.
set(_cfx_cuda_ok OFF)
if(CUDAToolkit_FOUND)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_cfx_nvcc nvcc)
    if(NOT _cfx_nvcc AND CUDAToolkit_NVCC_EXECUTABLE AND EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}" CACHE FILEPATH "CUDA compiler")
    elseif(NOT _cfx_nvcc AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_cfx_cuda_ok ON)
  endif()
endif()
conflux_resolve(CONFLUX_WITH_CUDA "${_cfx_cuda_ok}" "the CUDA toolkit (CUDAToolkit + nvcc)")

if(CONFLUX_WITH_CUDA_ENABLED)
  # Architectures, before enable_language (the detected default is one arch; "native" needs a GPU).
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(_cfx_wanted 70 75 80 86 89 90)
    execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --list-gpu-arch
                    OUTPUT_VARIABLE _cfx_archs_out ERROR_QUIET RESULT_VARIABLE _cfx_archs_rc)
    set(_cfx_archs "")
    foreach(a IN LISTS _cfx_wanted)
      if(NOT _cfx_archs_rc EQUAL 0 OR _cfx_archs_out MATCHES "compute_${a}")
        list(APPEND _cfx_archs ${a})
      endif()
    endforeach()
    list(LENGTH _cfx_archs _cfx_n)
    if(_cfx_n EQUAL 0)
      message(FATAL_ERROR "ConfluxCuda: ${CMAKE_CUDA_COMPILER} supports none of ${_cfx_wanted}; "
                          "set CMAKE_CUDA_ARCHITECTURES")
    endif()
    list(POP_BACK _cfx_archs _cfx_last)
    list(TRANSFORM _cfx_archs APPEND "-real")
    list(APPEND _cfx_archs ${_cfx_last})
    set(CMAKE_CUDA_ARCHITECTURES "${_cfx_archs}" CACHE STRING "CUDA architectures for conflux_cuda")
  endif()
  # The shared runtime for every target that nvcc links (libconflux links with it once it holds CUDA
  # objects): CMake's default, the static runtime, would add a second copy next to CUDA::cudart.
  if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)

  # NCCL: no CMake target exists; find the header and library by hand next to the toolkit.
  if(NOT CONFLUX_WITH_NCCL STREQUAL "OFF")
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
              PATH_SUFFIXES include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
                 ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  endif()
  set(_cfx_nccl_ok OFF)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(_cfx_nccl_ok ON)
  endif()
  conflux_resolve(CONFLUX_WITH_NCCL "${_cfx_nccl_ok}" "NCCL (nccl.h and libnccl)")

  set(_cfx_src ${CMAKE_CURRENT_LIST_DIR}/../capi/src)
  # The kernels need nvcc; the runtime wrappers around them are plain C.
  add_library(conflux_cuda STATIC ${_cfx_src}/cuda/cuda_kernels.cu ${_cfx_src}/cuda/cuda_wrappers.c)
  if(CONFLUX_WITH_NCCL_ENABLED)
    target_sources(conflux_cuda PRIVATE ${_cfx_src}/cuda/nccl_transport.c)
    target_include_directories(conflux_cuda SYSTEM PRIVATE ${NCCL_INCLUDE_DIR})
    target_link_libraries(conflux_cuda PUBLIC ${NCCL_LIBRARY})
  endif()
  set_target_properties(conflux_cuda PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    C_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF
    CUDA_SEPARABLE_COMPILATION OFF
    CUDA_RUNTIME_LIBRARY Shared)
  target_include_directories(conflux_cuda
    PUBLIC $<BUILD_INTERFACE:${_cfx_src}/cuda>
    PRIVATE ${_cfx_src} ${CMAKE_CURRENT_LIST_DIR}/../capi/include)
  target_compile_definitions(conflux_cuda
    PUBLIC CFX_HAVE_CUDA=1 CFX_HAVE_NCCL=$<BOOL:${CONFLUX_WITH_NCCL_ENABLED}>
    PRIVATE $<$<COMPILE_LANGUAGE:C>:_GNU_SOURCE>)
  # The engine's warning set for C; for CUDA the host compiler's and nvcc's own, all as errors.
  target_compile_options(conflux_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Wshadow -Wconversion -Wno-sign-conversion
      -Wstrict-prototypes -Wmissing-prototypes $<$<BOOL:${CONFLUX_WARNINGS_AS_ERRORS}>:-Werror>>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow
      $<$<BOOL:${CONFLUX_WARNINGS_AS_ERRORS}>:-Werror=all-warnings>>)
  # The runtime API only (CUDA::cudart); never the driver library (-lcuda): at build time only a
  # stub of it exists, and cudart loads the real one at run time.
  target_link_libraries(conflux_cuda PUBLIC CUDA::cudart)
  message(STATUS "ConfluxCuda: CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER}), architectures "
                 "${CMAKE_CUDA_ARCHITECTURES}; NCCL=${CONFLUX_WITH_NCCL_ENABLED} ${NCCL_LIBRARY}")
else()
  if(CONFLUX_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "CONFLUX_WITH_NCCL=ON needs CUDA (CONFLUX_WITH_CUDA is off or CUDA was not found)")
  endif()
endif()
