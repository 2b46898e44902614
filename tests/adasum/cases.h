/*
 * cases - the Adasum scenarios (CFX_OP_ADASUM), written once over the public ABI and run both on
 * thread ranks (tests/unit/test_adasum.c, the in-process transport) and under mpirun
 * (tests/mpi/test_mpi_adasum.c: the MPI transport, and the hierarchical form across pretend hosts).
 * Each takes a fresh context, runs one scenario on this rank and returns the number of failed
 * checks (printed with file:line and rank). Expected values come from a reference written here:
 * the adaptive sum computed directly in double, recursively over the ranks' inputs (which every
 * rank can generate), never from the engine.
 */
#ifndef CFX_TEST_ADASUM_CASES_H
#define CFX_TEST_ADASUM_CASES_H

#include <stddef.h>

#include "conflux/conflux.h"

/* Element access for float16/bfloat16/float32/float64 through double, given by the harness (its
 * own conversions: put rounds to nearest even). */
double ad_get(const void *buf, cfx_dtype dt, size_t i);
void ad_put(void *buf, cfx_dtype dt, size_t i, double v);

/* What the references expect, set by the harness: 0, Adasum over all ranks; k > 0, the
 * hierarchical form over hosts of k consecutive ranks (each host's average first, then Adasum
 * over the hosts' averages). */
extern int ad_host_size;

/* The scenarios, each on a fresh context, returning its failed checks:
 * - batch: every float dtype, a fused batch of tensors of several lengths (0 .. 4099, one out of
 *   place), a grouped call with prescale 2 and postscale 0.25, a large float32 tensor alone; two
 *   steps (the second from the response cache); within the dtype's rounding of the reference and
 *   bitwise identical on every rank;
 * - orthogonal: vectors with disjoint supports (some all zero): the result is their sum, exactly;
 * - identical: the same vector on every rank: the result is that vector, exactly, also at
 *   magnitudes 1e-6 (float32) and 1e-150 (float64), where a norm threshold would turn Adasum into
 *   a sum (across hosts of 3 ranks, "exactly" means to the rounding of the host's average);
 * - gradset_owned, gradset_borrowed: a gradient set with op Adasum (owned storage: several
 *   gradients per bucket), each gradient combined with its own dot products; two steps;
 * - join: the last rank joins first: its zeros are Adasum's identity;
 * - failure: with CFX_TEST_FAIL=1:ad.fail rank 1 fails an Adasum batch before its collective: every
 *   rank fails it naming rank 1, and the next Adasum allreduce is right (without it: succeeds);
 * - errors: local refusals with CFX_ERR_UNSUPPORTED naming the tensor: integer and bool dtypes,
 *   reducescatter, a grouped call with an integer member, an integer gradient in an Adasum set. */
typedef struct ad_case {
    const char *name;
    int (*run)(cfx_context *ctx);
} ad_case;
extern const ad_case ad_cases[];
extern const size_t ad_ncases;

#endif
