/*
 * mpitest - support for the multi-rank tests under mpirun: a rank-aware CHECK that records a
 * failure and goes on (so every rank keeps taking part in the collectives), an end-of-test agreement
 * that turns any rank's failure into a cmocka failure on every rank, context helpers, element access
 * for every cfx_dtype through double (with its own float16/bfloat16 conversions, independent of the
 * engine's), and a cross-rank bitwise-identity check.
 *
 * Only the public ABI (conflux.h) and MPI are used. Every test function follows the same shape:
 *   cfx_context *ctx = mt_open(...);  ...CHECKs...;  mt_close(ctx);  mt_finish();
 */
#ifndef CFX_MPITEST_H
#define CFX_MPITEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>
#include <mpi.h>

#include "conflux/conflux.h"

extern int mt_rank, mt_size;
extern int mt_failures; /* CHECK failures on this rank in the current test */

void mt_report(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records a failure with file:line and this rank, then continues. */
#define CHECK(cond, ...)                                \
    do {                                                \
        if (!(cond))                                    \
            mt_report(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* Checks a call's status; the message includes cfx_last_error() of the failing call. */
#define CHECK_ST(expr, want)                                                                     \
    do {                                                                                         \
        cfx_status mt_s_ = (expr);                                                               \
        if (mt_s_ != (cfx_status)(want))                                                         \
            mt_report(__FILE__, __LINE__, "%s returned %d (%s), expected %d (%s); last error: %s", \
                      #expr, (int)mt_s_, cfx_status_string(mt_s_), (int)(want),                  \
                      cfx_status_string((cfx_status)(want)), mt_last_error_copy());              \
    } while (0)
#define CHECK_OK(expr) CHECK_ST(expr, CFX_OK)

/* The last error, copied before any other Conflux call can replace it. */
const char *mt_last_error_copy(void);

/* Ends a test: every rank learns whether any rank failed; a failure fails the test everywhere. */
void mt_finish(void);

/* Barrier on MPI_COMM_WORLD (the application's own communicator; Conflux uses a duplicate). */
void mt_barrier(void);

/* Opens a context over MPI. threshold/chunk < 0 and deterministic < 0 keep the defaults. */
cfx_context *mt_open_opts(int64_t fusion_threshold, int64_t chunk_bytes, int deterministic,
                          int64_t cache_capacity);
cfx_context *mt_open(void);
void mt_close(cfx_context *ctx);

/* Waits (at most 60 s) and returns the handle's status; a timeout is reported as a failure. */
cfx_status mt_wait(cfx_context *ctx, cfx_handle h);
/* Waits, checks the status is `want`, and releases the handle. */
void mt_wait_expect(cfx_context *ctx, cfx_handle h, cfx_status want, const char *what);

/* Tensor memory for the tests. CFX_TEST_SHARED_TENSORS selects where it comes from: unset or
 * "none": malloc; "all": cfx_alloc (shared tensor memory) on every rank; "odd": cfx_alloc on odd
 * ranks only (a mixed batch); "low": on the lower half of the ranks (with CFX_TEST_LOCAL_SIZE, one
 * pretend host shared, the other not). A failed allocation is a test failure (NULL returned). */
void *mt_tensor_alloc(size_t bytes);
void mt_tensor_free(void *p);

/* Element access through double. put() rounds to nearest even for float16/bfloat16 and converts
 * integers exactly (callers keep values in range); bool stores v != 0. */
void mt_put(void *buf, cfx_dtype dt, size_t i, double v);
double mt_get(const void *buf, cfx_dtype dt, size_t i);
int mt_is_float(cfx_dtype dt);
int mt_is_signed(cfx_dtype dt);
/* Compares an output element with the expected value: exactly for integers and bool; for floats
 * within a relative tolerance suited to the dtype (rel_scale 0: exact). */
int mt_close_enough(cfx_dtype dt, double got, double want, double rel_scale);

/* The test inputs: rank r's value of element i of tensor t for a dtype/op pair, small integers so
 * that every sum, product, min and max over 4 ranks is exact in every dtype (bool: 0, 1 or 2). */
double mt_value(cfx_dtype dt, cfx_reduce_op op, int r, int t, size_t i);
/* Integer scaling as documented: x * f truncated toward zero, saturated to the dtype's range. */
double mt_int_scale(cfx_dtype dt, double x, double f);
/* postscale * op(prescale * mt_value(r) over ranks r) in double (AVERAGE divides by mt_size);
 * _skip leaves out skip_rank's input (a joined rank contributes the identity) but still divides
 * by mt_size. */
double mt_expected(cfx_dtype dt, cfx_reduce_op op, int t, size_t i, double pre, double post);
double mt_expected_skip(cfx_dtype dt, cfx_reduce_op op, int t, size_t i, double pre, double post,
                        int skip_rank);

/* Bytes are identical on every rank (FNV-1a hash; MIN == MAX over ranks). Collective. */
int mt_identical_across_ranks(const void *buf, size_t bytes);

/* xorshift64* in [0, n). */
uint64_t mt_rand(uint64_t *state);
void mt_shuffle(int *idx, int n, uint64_t *state);

/* Fails the test at once on every rank when `sub` is not in `msg` (also accepts msg == NULL). */
int mt_contains(const char *msg, const char *sub);

/* Sets NAME=VALUE arguments as environment variables, initialises MPI (MPI_THREAD_MULTIPLE), runs
 * the group, finalises. Returns the exit code. */
int mt_main(int argc, char **argv, const char *group_name, const struct CMUnitTest *tests, size_t n);
#define MT_RUN(argc, argv, tests) mt_main(argc, argv, __FILE__, tests, sizeof(tests) / sizeof(tests[0]))

#endif /* CFX_MPITEST_H */
