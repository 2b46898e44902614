/* Unit tests of the coordinator protocol's codec: round trips, and malformed input refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "protocol/gradset_wire.h"
#include "protocol/wire.h"

static cx_request sample_request(int i)
{
    cx_request q;
    memset(&q, 0, sizeof q);
    char name[64];
    snprintf(name, sizeof name, "layer%d.weight", i);
    q.name = strdup(name);
    q.group = i % 2 ? strdup("grp") : NULL;
    q.group_size = i % 2 ? 3 : 0;
    q.coll = (uint8_t)(i % 7);
    q.dtype = (uint8_t)(i % 11);
    q.op = (uint8_t)(i % 5);
    q.device = i % 3 - 1;
    q.root = i % 4;
    q.ndim = i % 5;
    for (int d = 0; d < q.ndim; d++)
        q.shape[d] = 3 * d + i;
    q.prescale = 0.5 * i;
    q.postscale = 1.0 / (i + 1);
    return q;
}

static void request_roundtrip(void **state)
{
    (void)state;
    cx_request_list l = {.rank = 3, .flags = CX_LIST_SHUTDOWN, .count = 20};
    l.items = calloc(l.count, sizeof *l.items);
    for (size_t i = 0; i < l.count; i++)
        l.items[i] = sample_request((int)i);
    cx_bytes b = {0};
    assert_int_equal(cx_encode_requests(&l, &b), CFX_OK);
    cx_request_list d;
    assert_int_equal(cx_decode_requests(b.data, b.len, &d), CFX_OK);
    assert_int_equal(d.rank, 3);
    assert_int_equal(d.flags, CX_LIST_SHUTDOWN);
    assert_int_equal(d.count, l.count);
    for (size_t i = 0; i < l.count; i++) {
        const cx_request *a = &l.items[i], *c = &d.items[i];
        assert_string_equal(a->name, c->name);
        if (a->group)
            assert_string_equal(a->group, c->group);
        else
            assert_null(c->group);
        assert_int_equal(a->group_size, c->group_size);
        assert_int_equal(a->coll, c->coll);
        assert_int_equal(a->dtype, c->dtype);
        assert_int_equal(a->op, c->op);
        assert_int_equal(a->device, c->device);
        assert_int_equal(a->root, c->root);
        assert_int_equal(a->ndim, c->ndim);
        assert_memory_equal(a->shape, c->shape, sizeof(int64_t) * (size_t)a->ndim);
        assert_true(a->prescale == c->prescale && a->postscale == c->postscale);
    }
    /* Every truncation is refused without a crash. */
    for (size_t len = 0; len < b.len; len++) {
        cx_request_list t;
        assert_int_not_equal(cx_decode_requests(b.data, len, &t), CFX_OK);
        cx_request_list_free(&t);
    }
    cx_request_list_free(&d);
    cx_request_list_free(&l);
    cx_bytes_free(&b);
}

static void response_roundtrip(void **state)
{
    (void)state;
    cx_response_list l = {.flags = 0, .count = 5};
    l.items = calloc(l.count, sizeof *l.items);
    for (size_t i = 0; i < l.count; i++) {
        cx_response *r = &l.items[i];
        cx_request q = sample_request((int)i);
        r->name = q.name;
        r->group = q.group;
        r->coll = q.coll;
        r->dtype = q.dtype;
        r->ndim = q.ndim;
        memcpy(r->shape, q.shape, sizeof r->shape);
        r->status = i == 2 ? CFX_ERR_MISMATCH : CFX_OK;
        r->message = i == 2 ? strdup("tensor 'layer2.weight': mismatched dtype") : NULL;
        r->last_joined = (int32_t)i - 1;
        if (i == 3) {
            r->nrows = 4;
            r->rank_rows = malloc(4 * sizeof(int64_t));
            for (int j = 0; j < 4; j++)
                r->rank_rows[j] = j * 10;
        }
    }
    cx_bytes b = {0};
    assert_int_equal(cx_encode_responses(&l, &b), CFX_OK);
    cx_response_list d;
    assert_int_equal(cx_decode_responses(b.data, b.len, &d), CFX_OK);
    assert_int_equal(d.count, l.count);
    assert_string_equal(d.items[2].message, l.items[2].message);
    assert_int_equal(d.items[2].status, CFX_ERR_MISMATCH);
    assert_null(d.items[1].message);
    assert_int_equal(d.items[3].nrows, 4);
    assert_int_equal(d.items[3].rank_rows[3], 30);
    assert_int_equal(d.items[4].last_joined, 3);
    /* Random corruption: decode either succeeds or fails cleanly (ASan checks the rest). */
    srand(7);
    for (int trial = 0; trial < 2000; trial++) {
        uint8_t *copy = malloc(b.len);
        memcpy(copy, b.data, b.len);
        copy[(size_t)rand() % b.len] = (uint8_t)rand();
        cx_response_list t;
        cx_decode_responses(copy, b.len, &t);
        cx_response_list_free(&t);
        free(copy);
    }
    cx_response_list_free(&d);
    cx_response_list_free(&l);
    cx_bytes_free(&b);
}

static void shape_helpers(void **state)
{
    (void)state;
    int64_t shape[3] = {2, 3, 4};
    char buf[64];
    assert_int_equal(cx_shape_elements(3, shape), 24);
    assert_int_equal(cx_shape_elements(0, shape), 1);
    assert_string_equal(cx_shape_format(3, shape, buf, sizeof buf), "[2, 3, 4]");
    assert_string_equal(cx_shape_format(0, shape, buf, sizeof buf), "[]");
}

/* A gradient set's registration, byte for byte as written out here (little-endian whatever the
 * host), and decoded back; a byte short or over is refused. */
static void gradset_registration_little_endian(void **state)
{
    (void)state;
    const cx_gradset_reg g = {"ab", 2, CFX_FLOAT32, CFX_DEVICE_CPU, 2, {3, 0x0102030405ll}};
    const uint8_t want[] = {
        1, 0, 0, 0,                  /* count */
        2, 0, 0, 0,                  /* compression */
        2, 0, 0, 0, 'a', 'b',        /* name */
        (uint8_t)CFX_FLOAT32, 0, 0, 0, /* dtype */
        0xff, 0xff, 0xff, 0xff,      /* device kind: CPU (-1) */
        2, 0, 0, 0,                  /* ndim */
        3, 0, 0, 0, 0, 0, 0, 0,      /* extents */
        0x05, 0x04, 0x03, 0x02, 0x01, 0, 0, 0};
    uint8_t buf[sizeof want];
    size_t len = 0;
    cx_gradset_wire_header(NULL, &len, 1, 2);
    cx_gradset_wire_grad(NULL, &len, &g);
    assert_int_equal(len, sizeof want);
    len = 0;
    cx_gradset_wire_header(buf, &len, 1, 2);
    cx_gradset_wire_grad(buf, &len, &g);
    assert_memory_equal(buf, want, sizeof want);
    cx_gradset_reg *out = NULL;
    uint32_t count = 0, compression = 0;
    assert_true(cx_gradset_wire_decode(want, sizeof want, &out, &count, &compression));
    assert_int_equal(count, 1);
    assert_int_equal(compression, 2);
    assert_int_equal(out[0].name_len, 2);
    assert_memory_equal(out[0].name, "ab", 2);
    assert_int_equal(out[0].dtype, CFX_FLOAT32);
    assert_int_equal(out[0].device, CFX_DEVICE_CPU);
    assert_int_equal(out[0].ndim, 2);
    assert_true(out[0].shape[0] == 3 && out[0].shape[1] == 0x0102030405ll);
    free(out);
    assert_false(cx_gradset_wire_decode(want, sizeof want - 1, &out, &count, &compression));
    assert_null(out);
    uint8_t longer[sizeof want + 1];
    memcpy(longer, want, sizeof want);
    longer[sizeof want] = 0;
    assert_false(cx_gradset_wire_decode(longer, sizeof longer, &out, &count, &compression));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gradset_registration_little_endian),
        cmocka_unit_test(request_roundtrip),
        cmocka_unit_test(response_roundtrip),
        cmocka_unit_test(shape_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
