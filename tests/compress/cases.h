/*
 * cases - gradient compression scenarios, written once over the public ABI and run on thread ranks
 * (tests/unit/test_compress.c, the in-process transport) and under mpirun (tests/mpi/
 * test_mpi_compress.c, on one host and across pretend hosts). Each takes a fresh context, runs on
 * this rank and returns the number of failed checks (printed with file:line and rank). Expected
 * values are computed here, in double, from what every rank contributed.
 *
 * `compressed` says whether the data path this run takes must compress (the caller knows: a
 * cross-host leg, or compression forced everywhere on a path over the transport). Compressed
 * results must lie within the 16-bit form's rounding of the exact sum (each value rounded once
 * when packed, each cross-rank combine rounded once) and be values of that form; uncompressed ones
 * must be bitwise those of an allreduce without compression. Either way every rank's bytes agree.
 */
#ifndef CFX_TEST_COMPRESS_CASES_H
#define CFX_TEST_COMPRESS_CASES_H

#include "conflux/conflux.h"

/* cfx_allreduce_async_opts with `compression` (FP16 or BF16, or an _EVERYWHERE form), SUM and
 * AVERAGE with scales, float32 and float64, a large tensor (many chunks) and a small one. */
int cz_case_allreduce(cfx_context *ctx, cfx_compression compression, int compressed);
/* A gradient set with compression: two steps, float32 and float64 gradients. Also: version 1
 * options (no compression field) still accepted and left alone past their end. */
int cz_case_gradset(cfx_context *ctx, cfx_compression compression, int compressed);
/* Error feedback on a quadratic: SGD on 1/2 |w - t|^2, each rank's gradient w - t plus a large
 * offset that cancels over ranks (not within a host), with a decaying step. Compressed without
 * feedback, the rounding of the large partial sums swallows every gradient below about a
 * quarter of their ulp and w stalls short of t; with feedback w reaches t. Uncompressed, both
 * reach t. Also: error_feedback without compression, or not 0/1, is refused. */
int cz_case_error_feedback(cfx_context *ctx, cfx_compression compression, int compressed);
/* Rank 0 asks for fp16, the others for none: CFX_ERR_MISMATCH on every rank naming the tensor;
 * the same for a gradient set's commit. */
int cz_case_mismatch(cfx_context *ctx);
/* Local refusals naming the tensor: int32 and float16 tensors, Adasum, an unknown compression, an
 * unknown options version, a float16 gradient in a compressed set. */
int cz_case_errors(cfx_context *ctx);

#endif
