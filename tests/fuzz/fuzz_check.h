/*
 * fuzz_check - the one assertion of the fuzz targets: a property that does not hold prints what
 * and aborts, which libFuzzer (and the corpus replay) report as a crash with the input.
 */
#ifndef CFX_FUZZ_CHECK_H
#define CFX_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond, ...)                                                        \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, "\n");                                                   \
            abort();                                                                 \
        }                                                                            \
    } while (0)

#endif /* CFX_FUZZ_CHECK_H */
