# Finds the optional dependencies and sets CONFLUX_WITH_<X>_ENABLED for each part.
if(NOT CONFLUX_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C)
endif()
conflux_resolve(CONFLUX_WITH_MPI "${MPI_C_FOUND}" "MPI (libopenmpi-dev)")
if(NOT CONFLUX_WITH_GLOO STREQUAL "OFF")
  find_package(Gloo QUIET)
endif()
conflux_resolve(CONFLUX_WITH_GLOO "${Gloo_FOUND}" "Gloo (libgloo-dev)")

include(ConfluxCuda)   # CONFLUX_WITH_CUDA/NCCL_ENABLED and the conflux_cuda target

set(CFX_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none)

# cfx_add_mpi_test(NAME NP COMMAND...): a test run under mpirun with NP ranks and the flags this
# machine needs (root, oversubscription, no binding). mpirun's own timeout stays below ctest's so a
# hang fails readably.
function(cfx_add_mpi_test name np)
  add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --timeout 150
           ${MPIEXEC_PREFLAGS} ${ARGN} ${MPIEXEC_POSTFLAGS})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${CFX_MPI_ENV}" TIMEOUT 180 PROCESSORS ${np})
endfunction()
