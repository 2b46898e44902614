/*
 * fuzz_wire - the coordinator protocol's decoders (protocol/wire.c) on arbitrary bytes: request
 * lists (what every rank sends the coordinator) and response lists (what it broadcasts back).
 *
 * Every input goes to both decoders. What must hold:
 * - no crash, no read past the input, no leak (ASan, UBSan, LeakSanitizer);
 * - a refusal is CFX_ERR_TRANSPORT (or out of memory) with a message that says "malformed" and
 *   names the sender;
 * - an accepted input re-encodes to exactly the same bytes (the codec is canonical, so the decoder
 *   kept every field), and its deep copies and shape helpers work on what was decoded.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "fuzz_check.h"
#include "protocol/wire.h"

static void check_refusal(cfx_status st, const char *sender)
{
    const char *msg = cx_error_message();
    FUZZ_CHECK(st == CFX_ERR_TRANSPORT || st == CFX_ERR_OUT_OF_MEMORY, "status %d", (int)st);
    if (st == CFX_ERR_TRANSPORT)
        FUZZ_CHECK(strstr(msg, "malformed") && strstr(msg, sender), "message '%s'", msg);
}

static void check_same_bytes(const cx_bytes *b, const uint8_t *data, size_t size)
{
    FUZZ_CHECK(!b->failed, "re-encoding failed");
    FUZZ_CHECK(b->len == size && memcmp(b->data, data, size) == 0,
               "re-encoding gave %zu bytes for %zu accepted ones", b->len, size);
}

static void shape_helpers(int32_t ndim, const int64_t *shape)
{
    char buf[64]; /* short on purpose: a long shape must be cut, not overflow */
    FUZZ_CHECK(cx_shape_elements(ndim, shape) >= 0, "negative element count");
    cx_shape_format(ndim, shape, buf, sizeof buf);
    FUZZ_CHECK(strlen(buf) < sizeof buf, "shape text not terminated");
}

static void requests(const uint8_t *data, size_t size)
{
    cx_request_list l;
    cfx_status st = cx_decode_requests(data, size, &l);
    if (st) {
        check_refusal(st, "rank");
        cx_request_list_free(&l);
        return;
    }
    cx_bytes b = {0};
    FUZZ_CHECK(cx_encode_requests(&l, &b) == CFX_OK, "re-encoding: %s", cx_error_message());
    check_same_bytes(&b, data, size);
    cx_bytes_free(&b);
    for (size_t i = 0; i < l.count; i++) {
        cx_request copy;
        FUZZ_CHECK(cx_request_copy(&copy, &l.items[i]), "copy failed");
        FUZZ_CHECK(strcmp(copy.name, l.items[i].name) == 0, "copy changed the name");
        shape_helpers(copy.ndim, copy.shape);
        cx_request_free(&copy);
    }
    cx_request_list_free(&l);
}

static void responses(const uint8_t *data, size_t size)
{
    cx_response_list l;
    cfx_status st = cx_decode_responses(data, size, &l);
    if (st) {
        check_refusal(st, "coordinator");
        cx_response_list_free(&l);
        return;
    }
    cx_bytes b = {0};
    FUZZ_CHECK(cx_encode_responses(&l, &b) == CFX_OK, "re-encoding: %s", cx_error_message());
    check_same_bytes(&b, data, size);
    cx_bytes_free(&b);
    for (size_t i = 0; i < l.count; i++) {
        cx_response copy;
        FUZZ_CHECK(cx_response_copy(&copy, &l.items[i]), "copy failed");
        FUZZ_CHECK(copy.nrows == l.items[i].nrows, "copy changed the rows");
        shape_helpers(copy.ndim, copy.shape);
        cx_response_free(&copy);
    }
    cx_response_list_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    requests(data, size);
    responses(data, size);
    return 0;
}
