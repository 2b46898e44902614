/*
 * fuzz_handshake - the handshake table (protocol/wire.c) and the verdict on it
 * (protocol/handshake.c) on arbitrary bytes. Input: one byte giving the job size (1 + b % 64),
 * then the table as rank 0 would broadcast it.
 *
 * What must hold: no crash, overread or leak; a table that does not parse is CFX_ERR_TRANSPORT
 * naming rank 0; on a table that parses, the verdict is CFX_OK exactly when every record is
 * readable and all wire majors are equal (computed here independently), and a refusal is
 * CFX_ERR_VERSION with a message that names a rank and a wire protocol.
 */
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "fuzz_check.h"
#include "protocol/handshake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int ranks = 1 + data[0] % 64;
    cx_hello all[64];
    cfx_status st = cx_decode_hello_table(data + 1, size - 1, ranks, all);
    if (st) {
        FUZZ_CHECK(st == CFX_ERR_TRANSPORT, "status %d", (int)st);
        FUZZ_CHECK(strstr(cx_error_message(), "rank 0"), "message '%s'", cx_error_message());
        return 0;
    }
    int talk = 1;
    for (int r = 0; r < ranks; r++)
        talk = talk && all[r].readable && all[r].wire_major == all[0].wire_major;
    cx_logger quiet = {.level = CX_LOG_OFF, .rank = 0, .fd = -1};
    st = cx_hello_verdict(all, ranks, 0, &quiet);
    if (talk) {
        FUZZ_CHECK(st == CFX_OK, "refused a job that can talk: %s", cx_error_message());
    } else {
        const char *msg = cx_error_message();
        FUZZ_CHECK(st == CFX_ERR_VERSION, "status %d for a job that cannot talk", (int)st);
        FUZZ_CHECK(strstr(msg, "rank") && (strstr(msg, "wire protocol") || strstr(msg, "handshake")),
                   "message '%s'", msg);
    }
    return 0;
}
