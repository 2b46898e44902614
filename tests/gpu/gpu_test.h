/*
 * gpu_test - the few helpers the GPU tests share: checks that count failures, the skip protocol
 * (a "skipped: no CUDA device (<reason>)" line and exit code 77, which ctest reports as skipped,
 * never as passed; a failure instead under CFX_TEST_GPU_REQUIRED) and a deterministic random
 * source.
 */
#ifndef CFX_GPU_TEST_H
#define CFX_GPU_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "conflux/conflux.h"

#define GPU_TEST_SKIP 77

static int gpu_test_failures;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            gpu_test_failures++;                                                                  \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                       \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
        }                                                                                         \
    } while (0)

/* Checks a cfx_status and prints the thread's message on failure; evaluates to the status. */
#define CHECK_OK(call)                                                                            \
    do {                                                                                          \
        cfx_status st_ = (call);                                                                  \
        CHECK(st_ == CFX_OK, "%s -> %s: %s", #call, cfx_status_string(st_), cx_error_message());  \
    } while (0)

/* Like CHECK_OK but ends the test: later steps would only cascade. */
#define REQUIRE_OK(call)                                                                          \
    do {                                                                                          \
        cfx_status st_ = (call);                                                                  \
        if (st_ != CFX_OK) {                                                                      \
            fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,              \
                    cfx_status_string(st_), cx_error_message());                                  \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* CFX_TEST_GPU_REQUIRED=1 (tests/gpu/run.sh on a GPU machine) turns the skip into a failure. */
static inline int gpu_test_skip(const char *test, const char *reason)
{
    const char *required = getenv("CFX_TEST_GPU_REQUIRED");
    if (required && *required && *required != '0') {
        printf("%s: FAILED: no CUDA device (%s), but CFX_TEST_GPU_REQUIRED is set\n", test, reason);
        fflush(stdout);
        return 1;
    }
    printf("%s: skipped: no CUDA device (%s)\n", test, reason);
    fflush(stdout);
    return GPU_TEST_SKIP;
}

static inline int gpu_test_finish(const char *test)
{
    if (gpu_test_failures) {
        printf("%s: FAILED (%d checks)\n", test, gpu_test_failures);
        return 1;
    }
    printf("%s: passed\n", test);
    return 0;
}

/* xorshift64*: the same sequence on every machine. */
static inline uint64_t gpu_test_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

#endif /* CFX_GPU_TEST_H */
