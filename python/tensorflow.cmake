# conflux/_tf_ops.tf<version>.so: conflux.tensorflow's TF custom ops (bindings/tensorflow/tf_ops.cpp), C++
# against the headers, flags and libtensorflow_framework of the tensorflow that
# ${Python3_EXECUTABLE} imports (the pinned tensorflow-cpu of the project's .venv,
# tools/python-requirements.txt). Loaded by conflux/tensorflow/_ops.py with tf.load_op_library (the
# ops) and ctypes (cfx_tf_set_context and friends). The TensorFlow version is in the file name: the
# loader picks the library built for the tensorflow it runs with, and names both versions when there
# is none (a clear ImportError, not a crash in the loader); the dot in the name also keeps the file
# from looking like a Python module to pkgutil. Without tensorflow it is not built (the reason
# is printed) and the TF tests skip saying why. Included at the end of python/CMakeLists.txt.
set(_cfx_tf_reason "")
execute_process(COMMAND ${Python3_EXECUTABLE} -c
                "import os; os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3'); import tensorflow as tf; print(tf.__version__); print(';'.join(tf.sysconfig.get_compile_flags())); print(';'.join(tf.sysconfig.get_link_flags()))"
                OUTPUT_VARIABLE _cfx_tf_query OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_VARIABLE _cfx_tf_err RESULT_VARIABLE _cfx_tf_rc)
if(NOT _cfx_tf_rc EQUAL 0)
  string(REGEX REPLACE ".*\n([^\n]+)\n?$" "\\1" _cfx_tf_err "${_cfx_tf_err}")
  set(_cfx_tf_reason "tensorflow does not import in ${Python3_EXECUTABLE} (${_cfx_tf_err}); tools/install-python installs the pinned tensorflow-cpu")
else()
  string(REPLACE "\n" ";" _cfx_tf_lines "${_cfx_tf_query}")
  list(LENGTH _cfx_tf_lines _cfx_tf_n)
  if(_cfx_tf_n LESS 3)
    set(_cfx_tf_reason "tf.sysconfig gave no compile/link flags (${_cfx_tf_query})")
  else()
    # The three printed lines: the version, then the flag lists (';'-joined, so one CMake list
    # each after the newlines became ';' too: split by prefix instead).
    list(GET _cfx_tf_lines 0 CFX_TF_VERSION)
    list(REMOVE_AT _cfx_tf_lines 0)
    set(CFX_TF_INCLUDE_DIRS)
    set(CFX_TF_DEFINES)
    set(CFX_TF_LINK_DIRS)
    set(CFX_TF_LIBS)
    foreach(_f IN LISTS _cfx_tf_lines)
      if(_f MATCHES "^-I(.+)")
        list(APPEND CFX_TF_INCLUDE_DIRS ${CMAKE_MATCH_1})
      elseif(_f MATCHES "^-D(.+)")
        list(APPEND CFX_TF_DEFINES ${CMAKE_MATCH_1})
      elseif(_f MATCHES "^-L(.+)")
        list(APPEND CFX_TF_LINK_DIRS ${CMAKE_MATCH_1})
      elseif(_f MATCHES "^-l(.+)")
        list(APPEND CFX_TF_LIBS ${_f})
      endif()  # --std=c++17: CXX_STANDARD below
    endforeach()
    if(NOT CFX_TF_INCLUDE_DIRS OR NOT EXISTS "${CFX_TF_INCLUDE_DIRS}/tensorflow/core/framework/op_kernel.h")
      set(_cfx_tf_reason "tensorflow's headers (tensorflow/core/framework/op_kernel.h) are not in '${CFX_TF_INCLUDE_DIRS}'")
    elseif(NOT CFX_TF_LIBS)
      set(_cfx_tf_reason "tf.sysconfig.get_link_flags() names no library")
    endif()
  endif()
endif()

if(_cfx_tf_reason)
  message(STATUS "conflux.tensorflow: op library not built: ${_cfx_tf_reason}")
  set(CONFLUX_WITH_TENSORFLOW_ENABLED OFF)
else()
  message(STATUS "conflux.tensorflow: op library against tensorflow ${CFX_TF_VERSION} (${CFX_TF_INCLUDE_DIRS})")
  set(CONFLUX_WITH_TENSORFLOW_ENABLED ON)
  add_library(cfx_tf_ops SHARED ${PROJECT_SOURCE_DIR}/bindings/tensorflow/tf_ops.cpp)
  set_target_properties(cfx_tf_ops PROPERTIES OUTPUT_NAME _tf_ops.tf${CFX_TF_VERSION} PREFIX "" SUFFIX ".so"
    LIBRARY_OUTPUT_DIRECTORY ${CFX_PY_PKG_DIR} CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF)
  # TensorFlow's headers are not ours: their warnings stay out of the build's.
  target_include_directories(cfx_tf_ops SYSTEM PRIVATE ${CFX_TF_INCLUDE_DIRS})
  target_compile_definitions(cfx_tf_ops PRIVATE ${CFX_TF_DEFINES}
    CFX_TF_BUILT_VERSION="${CFX_TF_VERSION}")
  target_compile_options(cfx_tf_ops PRIVATE -Wno-unused-parameter -Wno-sign-compare)
  target_link_directories(cfx_tf_ops PRIVATE ${CFX_TF_LINK_DIRS})
  target_link_libraries(cfx_tf_ops PRIVATE conflux ${CFX_TF_LIBS})
  # libtensorflow_framework is found next to the tensorflow package that loads this library (it
  # is already loaded by then); libconflux as for the other modules.
  set_target_properties(cfx_tf_ops PROPERTIES BUILD_RPATH "${CFX_TF_LINK_DIRS};$<TARGET_FILE_DIR:conflux>"
    INSTALL_RPATH "$ORIGIN/${_cfx_py_rpath};${CFX_TF_LINK_DIRS}")
  add_dependencies(cfx_python cfx_tf_ops)
  install(TARGETS cfx_tf_ops LIBRARY DESTINATION ${_cfx_py_dest}/conflux COMPONENT python)
endif()
set(CONFLUX_WITH_TENSORFLOW_ENABLED ${CONFLUX_WITH_TENSORFLOW_ENABLED} PARENT_SCOPE)

# ---- tests: python/tests/tensorflow under mpirun and under cfxrun (Gloo) at 2 and 3 ranks; Horovod's
# TF2 examples at 2; elastic Keras under cfxrun --elastic ----
# Registered whether or not the op library was built: without it the tests skip with the reason.
if(BUILD_TESTING)
  set(_cfx_tf_env ${_cfx_py_env} CFX_STALL_TIMEOUT_S=60
      # Small CPU programs on a shared machine: one thread per pool, quiet TF logging.
      OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
      TF_ENABLE_ONEDNN_OPTS=0 CUDA_VISIBLE_DEVICES= KERAS_BACKEND=tensorflow)
  if(NOT CONFLUX_WITH_TENSORFLOW_ENABLED)
    list(APPEND _cfx_tf_env "CFX_TF_SKIP_REASON=${_cfx_tf_reason}")
  endif()
  set(_cfx_tf_tests ${CMAKE_CURRENT_SOURCE_DIR}/tests/tensorflow)
  # TF imports slowly: each test file is one process doing many checks; -p no:randomly keeps order.
  if(CONFLUX_WITH_MPI_ENABLED)
    foreach(_np 2 3)
      cfx_add_mpi_test(python_tensorflow_np${_np} ${_np} ${_cfx_pytest} -rs ${_cfx_tf_tests})
      set_property(TEST python_tensorflow_np${_np} APPEND PROPERTY ENVIRONMENT ${_cfx_tf_env})
      set_property(TEST python_tensorflow_np${_np} APPEND PROPERTY LABELS "python;tensorflow")
    endforeach()
  endif()
  # Horovod's TF2 examples (python/tests/tensorflow_scripts/horovod_examples) at 2 ranks, MPI.
  # Two small trainings (about a minute on 2 idle cores): mpirun's limit above cfx_add_mpi_test's.
  if(CONFLUX_WITH_MPI_ENABLED)
    add_test(NAME python_tensorflow_horovod_examples_np2
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --timeout 280 ${MPIEXEC_PREFLAGS}
                     ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tests/tensorflow_scripts/run_horovod_example.py
                     synthetic mnist ${MPIEXEC_POSTFLAGS})
    set_tests_properties(python_tensorflow_horovod_examples_np2 PROPERTIES LABELS "python;tensorflow"
                         TIMEOUT 300 PROCESSORS 2 SKIP_RETURN_CODE 77
                         ENVIRONMENT "${CFX_MPI_ENV};${_cfx_tf_env}")
  endif()
  # Elastic Keras under cfxrun --elastic (Gloo: an MPI world cannot shrink): a rank is lost and
  # the survivors finish with the fixed-world reference's weights.
  if(CONFLUX_WITH_GLOO_ENABLED)
    add_test(NAME python_tensorflow_elastic
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tests/tensorflow_scripts/check_elastic_keras.py)
    set_tests_properties(python_tensorflow_elastic PROPERTIES LABELS "python;tensorflow;elastic"
                         TIMEOUT 300 PROCESSORS 2 SKIP_RETURN_CODE 77
                         ENVIRONMENT "${_cfx_tf_env}")
  endif()
  foreach(_np 2 3)  # the Gloo transport at the same sizes as MPI's
    add_test(NAME python_tensorflow_cfxrun_np${_np}
             COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/cfxrun -np ${_np} --transport gloo
                     --timeout 230 ${_cfx_pytest} -rs ${_cfx_tf_tests})
    set_tests_properties(python_tensorflow_cfxrun_np${_np} PROPERTIES LABELS "python;tensorflow"
                         TIMEOUT 240 PROCESSORS ${_np} ENVIRONMENT "${CFX_MPI_ENV};${_cfx_tf_env}")
  endforeach()
endif()
