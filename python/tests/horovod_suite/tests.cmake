# python/tests/horovod_suite: Horovod's own PyTorch test suite (its test/parallel/test_torch.py,
# only the import changed to conflux.horovod.torch) under mpirun at 2, 3 and 4 ranks: every
# collective, dtype, error Horovod documents, process set, join, optimizer and broadcast it tests.
# Left out, with the reason (each a property of the test file on today's torch, not of Conflux):
# - test_broadcast_state, test_broadcast_state_options, test_force_allreduce: they build every
#   torch.optim optimizer, and torch 2.15's Muon refuses the tests' 1-D parameters (ValueError
#   from torch before any collective).
# - at 3 ranks only, test_horovod_allreduce_prescale, test_horovod_reducescatter_prescale and
#   test_horovod_grouped_reducescatter_prescale: for float16 they demand that the float16 sum of
#   three float16 values h equal 3*h computed in float32 (rtol 0 at <= 3 ranks), which float16
#   cannot hold for most h (at 2 and 4 ranks the sum is exact; Horovod's CI ran 2).
# - at 3 and 4 ranks, test_global_barrier_op and test_process_set_barrier_op: each rank times from
#   its return out of the allreduce before the barrier and demands >= 5 s with no margin (rank 0
#   sleeps 5 s; the process-set one also wants the other set's barrier under 1 s); with more ranks
#   than this host's 2 cores, ranks return from that allreduce a scheduling slice apart, so one
#   that returned later measures 4.99 s (and, failing, skips the test's last barrier, which the
#   others then report as a stall). The stall itself is checked with a margin by
#   python/tests/mpi/test_numpy_collectives.py::test_barrier (the job's) and, for a set's, by
#   test_horovod_process_sets.py::test_a_sets_barrier_holds_its_members_only, at 2, 3 and 4 ranks.
# Included by python/CMakeLists.txt inside if(BUILD_TESTING) where MPI is built.
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch, numpy, packaging, pytest"
                RESULT_VARIABLE _hvds_rc OUTPUT_QUIET ERROR_QUIET)
if(NOT _hvds_rc EQUAL 0)
  message(STATUS "python/tests/horovod_suite: skipped (${Python3_EXECUTABLE} lacks torch, numpy, packaging or pytest)")
  return()
endif()

set(_hvds_dir ${CMAKE_CURRENT_SOURCE_DIR}/tests/horovod_suite)
set(_hvds_out "not test_broadcast_state and not test_force_allreduce")
foreach(_np 2 3 4)
  set(_hvds_k "${_hvds_out}")
  if(_np EQUAL 3)
    string(APPEND _hvds_k " and not allreduce_prescale and not reducescatter_prescale")
  endif()
  if(_np GREATER 2)
    string(APPEND _hvds_k " and not test_global_barrier_op and not test_process_set_barrier_op")
  endif()
  add_test(NAME python_horovod_suite_np${_np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${_np} --timeout 560
                   ${MPIEXEC_PREFLAGS} ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   --color=no --timeout=300 -rfEs --tb=short -k "${_hvds_k}" ${_hvds_dir}/test_torch.py
                   ${MPIEXEC_POSTFLAGS})
  set_tests_properties(python_horovod_suite_np${_np} PROPERTIES LABELS "python;torch;mpi"
                       TIMEOUT 600 PROCESSORS ${_np}
                       ENVIRONMENT "${CFX_MPI_ENV};${_cfx_py_env};OMP_NUM_THREADS=1;CFX_STALL_TIMEOUT_S=60")
endforeach()
