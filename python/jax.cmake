# conflux/_jax_ffi.so: conflux.jax's XLA FFI handlers (bindings/jax/jax_ffi.cpp), C++ against the
# FFI header of the jaxlib that ${Python3_EXECUTABLE} imports (the pinned wheel of the project's
# .venv, tools/python-requirements.txt). A plain shared library over libconflux with no Python
# API (so no Python module may share its name): conflux/_jax_primitive.py loads it with ctypes and
# registers its handlers with jax.ffi. Without jaxlib it is not built (the reason is printed) and
# the JAX tests skip saying why. Included at the end of python/CMakeLists.txt.
set(_cfx_jax_reason "")
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import jax.ffi; print(jax.ffi.include_dir())"
                OUTPUT_VARIABLE CFX_JAX_FFI_INCLUDE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_VARIABLE _cfx_jax_err RESULT_VARIABLE _cfx_jax_rc)
if(NOT _cfx_jax_rc EQUAL 0)
  string(REGEX REPLACE ".*\n([^\n]+)\n?$" "\\1" _cfx_jax_err "${_cfx_jax_err}")
  set(_cfx_jax_reason "jaxlib does not import in ${Python3_EXECUTABLE} (${_cfx_jax_err}); tools/install-python installs the pinned jax/jaxlib")
elseif(NOT EXISTS ${CFX_JAX_FFI_INCLUDE_DIR}/xla/ffi/api/ffi.h)
  set(_cfx_jax_reason "jaxlib's FFI header xla/ffi/api/ffi.h is not in ${CFX_JAX_FFI_INCLUDE_DIR}")
endif()

if(_cfx_jax_reason)
  message(STATUS "conflux.jax: FFI handlers not built: ${_cfx_jax_reason}")
  set(CONFLUX_WITH_JAX_ENABLED OFF)
else()
  message(STATUS "conflux.jax: FFI handlers against ${CFX_JAX_FFI_INCLUDE_DIR}")
  set(CONFLUX_WITH_JAX_ENABLED ON)
  add_library(cfx_jax_ffi SHARED ${PROJECT_SOURCE_DIR}/bindings/jax/jax_ffi.cpp)
  set_target_properties(cfx_jax_ffi PROPERTIES OUTPUT_NAME _jax_ffi PREFIX "" SUFFIX ".so"
    LIBRARY_OUTPUT_DIRECTORY ${CFX_PY_PKG_DIR} CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  # jaxlib's header is not ours: its warnings stay out of the build's.
  target_include_directories(cfx_jax_ffi SYSTEM PRIVATE ${CFX_JAX_FFI_INCLUDE_DIR})
  target_link_libraries(cfx_jax_ffi PRIVATE conflux)
  # Clean under these (-Wpedantic is not: jaxlib's c_api.h trips it even as a system header).
  target_compile_options(cfx_jax_ffi PRIVATE -Wall -Wextra -Wshadow -Wconversion)
  add_dependencies(cfx_python cfx_jax_ffi)
  set_target_properties(cfx_jax_ffi PROPERTIES INSTALL_RPATH "$ORIGIN/${_cfx_py_rpath}")
  install(TARGETS cfx_jax_ffi LIBRARY DESTINATION ${_cfx_py_dest}/conflux COMPONENT python)
endif()
set(CONFLUX_WITH_JAX_ENABLED ${CONFLUX_WITH_JAX_ENABLED} PARENT_SCOPE)

# ---- tests: python/tests/jax under mpirun at 2 and 3 ranks, and under cfxrun --transport gloo at 2;
# elastic_driver.py's job under cfxrun --elastic ----
# Registered whether or not the handlers were built: without them the tests skip with the reason.
if(BUILD_TESTING)
  set(_cfx_jax_env ${_cfx_py_env} CFX_STALL_TIMEOUT_S=60
      # Small CPU programs on a shared machine: one XLA thread pool thread per rank.
      XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
      OMP_NUM_THREADS=1 JAX_PLATFORMS=cpu)
  if(NOT CONFLUX_WITH_JAX_ENABLED)
    list(APPEND _cfx_jax_env "CFX_JAX_SKIP_REASON=${_cfx_jax_reason}")
  endif()
  set(_cfx_jax_tests ${CMAKE_CURRENT_SOURCE_DIR}/tests/jax)
  if(CONFLUX_WITH_MPI_ENABLED)
    foreach(_np 2 3)
      cfx_add_mpi_test(python_jax_np${_np} ${_np} ${_cfx_pytest} -rs ${_cfx_jax_tests})
      set_property(TEST python_jax_np${_np} APPEND PROPERTY ENVIRONMENT ${_cfx_jax_env})
      set_property(TEST python_jax_np${_np} APPEND PROPERTY LABELS "python;jax")
    endforeach()
  endif()
  # Under Gloo the collectives and the training (the launcher and transport are what differ;
  # gradients, process sets and the elastic state's unit tests run under mpirun above).
  add_test(NAME python_jax_cfxrun_np2
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/cfxrun -np 2 --transport gloo --timeout 150
                   ${_cfx_pytest} -rs ${_cfx_jax_tests}/test_collectives.py
                   ${_cfx_jax_tests}/test_train.py)
  set_tests_properties(python_jax_cfxrun_np2 PROPERTIES LABELS "python;jax" TIMEOUT 180
                       PROCESSORS 2 ENVIRONMENT "${CFX_MPI_ENV};${_cfx_jax_env}")
  # An elastic job that loses one of its 3 workers and goes on (cfxrun --elastic: Gloo only).
  if(CONFLUX_WITH_GLOO_ENABLED)
    add_test(NAME python_jax_elastic
             COMMAND ${Python3_EXECUTABLE} ${_cfx_jax_tests}/elastic_driver.py)
    set_tests_properties(python_jax_elastic PROPERTIES LABELS "python;jax;elastic" TIMEOUT 240
                         PROCESSORS 3 SKIP_RETURN_CODE 77 ENVIRONMENT "${_cfx_jax_env}")
  endif()
endif()
