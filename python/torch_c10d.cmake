# conflux/_torch_c10d.so: torch.distributed's backend "conflux" as a native c10d::Backend
# (bindings/python/torch_c10d.cpp), against the torch wheel that python/CMakeLists.txt found for
# _torch_native (its headers, its pybind11, its C++ ABI flag). Without it conflux.torch registers
# no backend and says why when init_process_group("conflux") is asked for.
if(NOT CONFLUX_WITH_TORCH_NATIVE_ENABLED)
  return()
endif()
if(NOT EXISTS ${CFX_TORCH_INCLUDE_DIR}/torch/csrc/distributed/c10d/Backend.hpp)
  message(STATUS "conflux._torch_c10d: the torch wheel has no c10d headers; not built")
  return()
endif()
cfx_torch_module(cfx_torch_c10d _torch_c10d ${PROJECT_SOURCE_DIR}/bindings/python/torch_c10d.cpp)
target_compile_definitions(cfx_torch_c10d PRIVATE USE_C10D_GLOO=0)
target_compile_options(cfx_torch_c10d PRIVATE -Wall -Wextra)
# CUDA tensors where Conflux and the wheel are both CUDA builds (PyPI's Linux torch is): the
# caller's current stream from c10_cuda, the runtime's types from the toolkit's headers (no cudart
# of our own: the wheel's is the one loaded).
find_library(CFX_C10_CUDA_LIB c10_cuda PATHS ${_cfx_torch_libdir} NO_DEFAULT_PATH)
if(CONFLUX_WITH_CUDA_ENABLED AND CFX_C10_CUDA_LIB AND CUDAToolkit_INCLUDE_DIRS
   AND EXISTS ${CFX_TORCH_INCLUDE_DIR}/c10/cuda/CUDAStream.h)
  target_compile_definitions(cfx_torch_c10d PRIVATE CFX_TORCH_CUDA=1)
  target_include_directories(cfx_torch_c10d SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(cfx_torch_c10d PRIVATE ${CFX_C10_CUDA_LIB})
  message(STATUS "conflux._torch_c10d: CUDA tensors too (c10_cuda, CUDA ${CUDAToolkit_VERSION})")
endif()
set_target_properties(cfx_torch_c10d PROPERTIES INSTALL_RPATH "$ORIGIN/${_cfx_py_rpath}")
install(TARGETS cfx_torch_c10d LIBRARY DESTINATION ${_cfx_py_dest}/conflux COMPONENT python)

# Its groups at 4 ranks (split_group's even and odd ranks: two groups of two over cfx_init_group;
# use_local_synchronization with rank 0 outside), beside the whole suites of python/CMakeLists.txt.
if(BUILD_TESTING AND CONFLUX_WITH_MPI_ENABLED)
  cfx_add_mpi_test(python_torch_c10d_groups_np4 4 ${_cfx_pytest} -k "group or split"
    ${CMAKE_CURRENT_SOURCE_DIR}/tests/mpi/test_torch_backend.py)
  set_property(TEST python_torch_c10d_groups_np4 APPEND PROPERTY ENVIRONMENT ${_cfx_py_env}
               CFX_STALL_TIMEOUT_S=60)
  set_property(TEST python_torch_c10d_groups_np4 APPEND PROPERTY LABELS python torch)
endif()
