# python/tests/lightning: Lightning's Trainer and Fabric and Hugging Face Accelerate training with
# DDP on the backend "conflux", against a local reference, at 2 ranks under torchrun, cfxrun
# (mpirun: Lightning's MPIEnvironment, through mpi4py) and cfxrun --transport gloo (no MPI:
# conflux.lightning.ConfluxEnvironment). All scenarios of one launcher run in one pytest process per
# rank (process start and the imports of torch, Lightning and Accelerate are most of the cost).
# Included by python/CMakeLists.txt inside if(BUILD_TESTING), where ${_cfx_py_env} and
# ${Python3_EXECUTABLE} (the venv's) are set.
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import lightning, accelerate, torch.distributed"
                RESULT_VARIABLE _lt_rc OUTPUT_QUIET ERROR_QUIET)
if(NOT _lt_rc EQUAL 0)
  message(STATUS "python/tests/lightning: skipped (${Python3_EXECUTABLE} does not import lightning and accelerate)")
  return()
endif()

set(_lt_dir ${CMAKE_CURRENT_SOURCE_DIR}/tests/lightning)
# -rfEs: every failure, error and skip with its reason in the summary; COLUMNS: on one line
set(_lt_pytest_args -q -p no:cacheprovider --color=no --timeout=90 --timeout-method=thread
    -rfEs --tb=short ${_lt_dir})
# OMP_NUM_THREADS=1: the ranks share few cores. CFX_STALL_TIMEOUT_S: a rank that skipped a
# collective makes the others fail after 60 s instead of hanging.
set(_lt_env ${_cfx_py_env} OMP_NUM_THREADS=1 COLUMNS=300 CFX_STALL_TIMEOUT_S=60)

add_test(NAME python_lightning_torchrun_np2
         COMMAND ${Python3_EXECUTABLE} -m torch.distributed.run --standalone --nproc_per_node 2
                 --redirects 3 --tee 3 -m pytest ${_lt_pytest_args})
add_test(NAME python_lightning_cfxrun_gloo_np2
         COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/cfxrun -np 2 --transport gloo
                 --timeout 150 ${Python3_EXECUTABLE} -m pytest ${_lt_pytest_args})
set_tests_properties(python_lightning_torchrun_np2 python_lightning_cfxrun_gloo_np2 PROPERTIES
                     LABELS "python;lightning" TIMEOUT 180 PROCESSORS 2 ENVIRONMENT "${_lt_env}")

if(CONFLUX_WITH_MPI_ENABLED)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import mpi4py"
                  RESULT_VARIABLE _lt_mpi4py_rc OUTPUT_QUIET ERROR_QUIET)
  if(_lt_mpi4py_rc EQUAL 0)
    add_test(NAME python_lightning_cfxrun_np2
             COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/cfxrun -np 2 --timeout 150
                     ${Python3_EXECUTABLE} -m pytest ${_lt_pytest_args})
    set_tests_properties(python_lightning_cfxrun_np2 PROPERTIES LABELS "python;lightning;mpi"
                         TIMEOUT 180 PROCESSORS 2 ENVIRONMENT "${CFX_MPI_ENV};${_lt_env}")
  else()
    message(STATUS "python/tests/lightning: python_lightning_cfxrun_np2 skipped (${Python3_EXECUTABLE} does not import mpi4py, which Lightning's MPIEnvironment needs)")
  endif()
endif()
