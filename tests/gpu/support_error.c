/*
 * support_error - cx_fail() and friends for test programs that link the static conflux_cuda next
 * to the shared libconflux: conflux_cuda records its messages with cx_fail, which libconflux keeps
 * hidden, and linking capi/src/base/error.c instead would also define cfx_last_error() and
 * cfx_status_string() in the executable, shadowing the library's own.
 */
#include <stdarg.h>
#include <stdio.h>

#include "base/error.h"

static _Thread_local char message[CX_ERROR_MAX];

cfx_status cx_fail(cfx_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return status;
}

void cx_clear_error(void) { message[0] = '\0'; }

const char *cx_error_message(void) { return message; }
