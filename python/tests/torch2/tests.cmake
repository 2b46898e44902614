# python/tests/torch2: what PyTorch users run, on the backend "conflux" (issue #41 item 3): DDP
# (defaults, find_unused_parameters, no_sync, static_graph, gradient_as_bucket_view, torch's and
# Conflux's communication hooks), DDP with torch.compile, FSDP2, DTensor on 1-D and 2-D device
# meshes, functional collectives, object collectives, monitored_barrier, and a sharded
# torch.distributed.checkpoint saved on 2 ranks and loaded on 3. Every scenario runs at 2 and 3
# ranks under torchrun and under cfxrun (mpirun), all of them in one pytest process per rank
# (process start and torch's import are most of the cost). Included by python/CMakeLists.txt
# inside if(BUILD_TESTING), where ${_cfx_py_env} and ${Python3_EXECUTABLE} (the venv's) are set.
execute_process(COMMAND ${Python3_EXECUTABLE} -c
                "import torch, torch.distributed as d; assert d.is_available() and int(torch.__version__.split('.')[0]) >= 2"
                RESULT_VARIABLE _t2_torch_rc OUTPUT_QUIET ERROR_QUIET)
if(NOT _t2_torch_rc EQUAL 0)
  message(STATUS "python/tests/torch2: skipped (${Python3_EXECUTABLE} does not import torch 2.x)")
  return()
endif()

set(_t2_dir ${CMAKE_CURRENT_SOURCE_DIR}/tests/torch2)
# -rfEs: every failure, error and skip with its reason in the summary; COLUMNS: on one line
set(_t2_pytest_args -q -p no:cacheprovider --color=no --timeout=90 --timeout-method=thread
    -rfEs --tb=short ${_t2_dir})
# OMP_NUM_THREADS=1: several ranks share few cores. CFX_STALL_TIMEOUT_S: a rank that skipped a
# collective makes the others fail after 60 s instead of hanging.
set(_t2_env ${_cfx_py_env} OMP_NUM_THREADS=1 COLUMNS=300 CFX_STALL_TIMEOUT_S=60)
# test_compile.py's compiler: inductor compiles here, but a compile costs 25 s (cached) to a
# minute (cold) per rank on two cores; inductor in one job, aot_eager (the same dynamo capture,
# DDPOptimizer and AOT autograd, without inductor's code generation, which does not touch
# communication) in the others.
set(_t2_compile_torchrun_np2 inductor)
set(_t2_compile_torchrun_np3 aot_eager)
set(_t2_compile_cfxrun_np2 aot_eager)
set(_t2_compile_cfxrun_np3 aot_eager)

foreach(_np 2 3)
  add_test(NAME python_torch2_torchrun_np${_np}
           COMMAND ${Python3_EXECUTABLE} -m torch.distributed.run --standalone
                   --nproc_per_node ${_np} --redirects 3 --tee 3
                   -m pytest ${_t2_pytest_args})
  set_tests_properties(python_torch2_torchrun_np${_np} PROPERTIES LABELS "python;torch"
                       TIMEOUT 360 PROCESSORS ${_np}
                       ENVIRONMENT "${_t2_env};CFX_TORCH2_COMPILE_BACKEND=${_t2_compile_torchrun_np${_np}}")
  if(CONFLUX_WITH_MPI_ENABLED)
    add_test(NAME python_torch2_cfxrun_np${_np}
             COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/cfxrun -np ${_np}
                     --timeout 330 ${Python3_EXECUTABLE} -m pytest ${_t2_pytest_args})
    set_tests_properties(python_torch2_cfxrun_np${_np} PROPERTIES LABELS "python;torch;mpi"
                         TIMEOUT 360 PROCESSORS ${_np}
                         ENVIRONMENT "${CFX_MPI_ENV};${_t2_env};CFX_TORCH2_COMPILE_BACKEND=${_t2_compile_cfxrun_np${_np}}")
  endif()
endforeach()

# The sharded checkpoint: a 2-rank job saves, a 3-rank job loads from the same directory.
set(_t2_launchers torchrun)
if(CONFLUX_WITH_MPI_ENABLED)
  list(APPEND _t2_launchers cfxrun)
endif()
foreach(_launcher IN LISTS _t2_launchers)
  add_test(NAME python_torch2_dcp_${_launcher}
           COMMAND ${Python3_EXECUTABLE} ${_t2_dir}/dcp_driver.py ${_launcher} --save-np 2
                   --load-np 3 --timeout 150)
  set(_t2_labels python torch)
  if(_launcher STREQUAL "cfxrun")
    list(APPEND _t2_labels mpi)
  endif()
  set_tests_properties(python_torch2_dcp_${_launcher} PROPERTIES LABELS "${_t2_labels}"
                       TIMEOUT 330 PROCESSORS 3 ENVIRONMENT "${CFX_MPI_ENV};${_t2_env}"
                       FAIL_REGULAR_EXPRESSION "FAIL: ")
endforeach()
