/*
 * transport_mpi - the Open MPI transport.
 *
 * Initialises MPI with MPI_THREAD_MULTIPLE unless the application already did (then it checks the
 * level), works on a duplicate of MPI_COMM_WORLD so the application's own traffic is untouched,
 * derives local/cross ranks from a shared-memory split, and never calls MPI_Finalize before process
 * exit (an atexit handler finalizes MPI if Conflux initialised it), so init -> shutdown -> init
 * works. Every operation is nonblocking underneath and waited for with a short spin, then sleeping
 * backoff (Open MPI has no progress thread here, so the background thread drives progress without
 * holding a core). float16/bfloat16 reductions use MPI user ops over the kernels in reduce.h.
 */
#ifndef CFX_TRANSPORT_MPI_H
#define CFX_TRANSPORT_MPI_H

#include "transport/transport.h"

/* Creates the transport on the calling thread (communicator creation is not thread-safe in Open
 * MPI). Collective over MPI_COMM_WORLD. `pretend_local_size` > 0 (CFX_TEST_LOCAL_SIZE, tests
 * only: base/test_hooks.h) splits the job into pretend hosts of that many consecutive ranks, so
 * the two-level paths can be tested on one machine; 0 finds the real hosts. */
cfx_status cx_transport_mpi_create(int pretend_local_size, cx_transport **out);

#endif /* CFX_TRANSPORT_MPI_H */
