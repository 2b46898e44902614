# python/tests/ray: conflux.ray on a real Ray cluster of two nodes on this machine (Ray's own
# multi-node test cluster, started and stopped by the test's fixture): RayExecutor at 2 and 4
# workers across both nodes against a single-process reference, a worker that raises and an actor
# that is killed (each ends run() with the named error), Ray Train's TorchTrainer with
# TorchConfig(backend="conflux"), and elastic jobs (a failed worker's node leaves whole, a node
# removed and one added). One pytest session for all of it: Ray's start is most of the cost.
# Included by python/CMakeLists.txt inside if(BUILD_TESTING), where ${_cfx_py_env} and
# ${Python3_EXECUTABLE} (the venv's) are set.
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import ray, ray.cluster_utils, torch"
                RESULT_VARIABLE _ray_rc OUTPUT_QUIET ERROR_QUIET)
if(NOT _ray_rc EQUAL 0)
  message(STATUS "python/tests/ray: skipped (${Python3_EXECUTABLE} does not import ray and torch; "
                 "tools/install-python installs ray[train])")
  return()
endif()
if(NOT CONFLUX_WITH_GLOO_ENABLED)
  message(STATUS "python/tests/ray: skipped (the Gloo transport is not built: libgloo-dev)")
  return()
endif()

# -rfEs: every failure, error and skip with its reason; --durations: what each scenario cost.
add_test(NAME python_ray
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider --color=no --timeout=300
                 --timeout-method=thread -rfEs --tb=short --durations=0
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/ray)
# The cluster's raylets and workers share this machine's cores with the rest of the run.
set_tests_properties(python_ray PROPERTIES LABELS "python;ray" TIMEOUT 480 PROCESSORS 2
                     ENVIRONMENT "${_cfx_py_env};OMP_NUM_THREADS=1;COLUMNS=300")
