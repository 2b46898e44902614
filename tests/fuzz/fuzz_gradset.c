/*
 * fuzz_gradset - a gradient set's registration codec (protocol/gradset_wire.c) on arbitrary bytes:
 * what one rank's cfx_gradset_commit receives from a peer.
 *
 * What must hold: no crash, overread or leak; a registration that decodes has a count its bytes
 * can hold, every name inside the input and ndim in 0..CFX_MAX_NDIM; and encoding the decoded
 * gradients again gives back exactly the input (the layout is fixed-size little-endian fields, so
 * a second encoding of one registration cannot exist).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "protocol/gradset_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cx_gradset_reg *g = NULL;
    uint32_t count = 0, compression = 0;
    if (!cx_gradset_wire_decode(data, size, &g, &count, &compression)) {
        FUZZ_CHECK(g == NULL, "a refused registration left %p", (void *)g);
        return 0;
    }
    FUZZ_CHECK(count <= size / 16, "count %u from %zu bytes", count, size);
    for (uint32_t i = 0; i < count; i++) {
        FUZZ_CHECK(g[i].ndim >= 0 && g[i].ndim <= CFX_MAX_NDIM, "gradient %u: ndim %d", i,
                   g[i].ndim);
        FUZZ_CHECK((const uint8_t *)g[i].name >= data &&
                   (const uint8_t *)g[i].name + g[i].name_len <= data + size,
                   "gradient %u: name outside the input", i);
    }
    size_t len = 0;
    cx_gradset_wire_header(NULL, &len, count, compression);
    for (uint32_t i = 0; i < count; i++)
        cx_gradset_wire_grad(NULL, &len, &g[i]);
    FUZZ_CHECK(len == size, "encoding again measures %zu bytes, the input has %zu", len, size);
    uint8_t *again = malloc(len ? len : 1);
    FUZZ_CHECK(again != NULL, "out of memory");
    len = 0;
    cx_gradset_wire_header(again, &len, count, compression);
    for (uint32_t i = 0; i < count; i++)
        cx_gradset_wire_grad(again, &len, &g[i]);
    FUZZ_CHECK(memcmp(again, data, size) == 0, "encoding again gives other bytes");
    free(again);
    free(g);
    return 0;
}
