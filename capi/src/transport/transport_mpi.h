/*
 * transport_mpi - the Open MPI transport.
 *
 * Initialises MPI with MPI_THREAD_MULTIPLE unless the application already did (then it checks the
 * level), works on a duplicate of MPI_COMM_WORLD so the application's own traffic is untouched,
 * derives local/cross ranks from the hosts (transport/hosts.h) that shared-memory splits find, and never calls MPI_Finalize before process
 * exit (an atexit handler finalizes MPI if Conflux initialised it), so init -> shutdown -> init
 * works. Every operation is nonblocking underneath and waited for with a short spin, then sleeping
 * backoff (Open MPI has no progress thread here, so the background thread drives progress without
 * holding a core). float16/bfloat16 reductions use MPI user ops over the kernels in reduce.h.
 */
#ifndef CFX_TRANSPORT_MPI_H
#define CFX_TRANSPORT_MPI_H

#include "transport/transport.h"

/* The registry's create function (transport.h's contract): the transport over mpirun's world,
 * made on the calling thread (communicator creation is not thread-safe in Open MPI). Collective over
 * MPI_COMM_WORLD; rank and size are MPI's (p->rank, p->size and p->store are not used). Every wait
 * gives up at p->timeout_s. p->pretend_local_size > 0 (CFX_TEST_LOCAL_SIZE, tests only:
 * base/test_hooks.h) splits the job into pretend hosts of that many consecutive ranks, so the
 * two-level paths can be tested on one machine; 0 finds the real hosts. */
cfx_status cx_transport_mpi_create(const cx_transport_params *p, cx_transport **out);

#endif /* CFX_TRANSPORT_MPI_H */
