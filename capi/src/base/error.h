/*
 * error - status strings and the thread-local last-error message.
 *
 * Every failing internal call records its message here with cx_fail() and returns the status; the
 * ABI entry points leave it for cfx_last_error(), and successful calls leave it alone. The buffer
 * is fixed-size and thread-local, so reporting never allocates (out-of-memory can still be
 * reported) and threads never see each other's messages.
 */
#ifndef CFX_ERROR_H
#define CFX_ERROR_H

#include "conflux/conflux.h"

#define CX_ERROR_MAX 2048

/* Records a printf-style message for this thread and returns `status`. */
cfx_status cx_fail(cfx_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This thread's message ("" when none). */
const char *cx_error_message(void);

#endif /* CFX_ERROR_H */
