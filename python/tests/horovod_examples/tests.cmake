# python/tests/horovod_examples: Horovod's PyTorch examples (pytorch_mnist.py on a dataset the
# runner writes, pytorch_synthetic_benchmark.py on ResNet-18 with tiny settings), their files with
# only the import changed to conflux.horovod, at 2, 3 and 4 ranks under mpirun; run_example.py
# checks that every rank ends with the same parameters, that training moved them, and that the
# MNIST model classifies the test images. Included by python/CMakeLists.txt inside
# if(BUILD_TESTING) where MPI is built (cfx_add_mpi_test, ${_cfx_py_env}).
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch, torchvision"
                RESULT_VARIABLE _hvdx_rc OUTPUT_QUIET ERROR_QUIET)
if(NOT _hvdx_rc EQUAL 0)
  message(STATUS "python/tests/horovod_examples: skipped (${Python3_EXECUTABLE} does not import torch and torchvision)")
  return()
endif()

set(_hvdx_run ${CMAKE_CURRENT_SOURCE_DIR}/tests/horovod_examples/run_example.py)
foreach(_np 2 3 4)
  set(_hvdx_data ${CMAKE_CURRENT_BINARY_DIR}/horovod_examples/mnist_np${_np})
  file(MAKE_DIRECTORY ${_hvdx_data})
  cfx_add_mpi_test(python_horovod_example_mnist_np${_np} ${_np} ${Python3_EXECUTABLE} ${_hvdx_run}
    mnist ${_hvdx_data} --epochs 2 --no-cuda --log-interval 1000)
  cfx_add_mpi_test(python_horovod_example_synthetic_np${_np} ${_np} ${Python3_EXECUTABLE} ${_hvdx_run}
    synthetic --model resnet18 --batch-size 2 --num-warmup-batches 1 --num-batches-per-iter 1
    --num-iters 2 --no-cuda)
  foreach(_ex mnist synthetic)
    set_property(TEST python_horovod_example_${_ex}_np${_np} APPEND PROPERTY ENVIRONMENT
                 ${_cfx_py_env} OMP_NUM_THREADS=1 CFX_STALL_TIMEOUT_S=60)
    set_property(TEST python_horovod_example_${_ex}_np${_np} APPEND PROPERTY LABELS python torch)
    set_tests_properties(python_horovod_example_${_ex}_np${_np} PROPERTIES
                         PASS_REGULAR_EXPRESSION "PASS: " FAIL_REGULAR_EXPRESSION "FAIL: ")
  endforeach()
endforeach()
