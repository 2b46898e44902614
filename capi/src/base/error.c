/* error - status strings and the thread-local last-error message (see error.h). */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char tls_message[CX_ERROR_MAX];

cfx_status cx_fail(cfx_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_message, sizeof tls_message, fmt, ap);
    va_end(ap);
    return status;
}

const char *cx_error_message(void) { return tls_message; }

const char *cfx_last_error(void) { return tls_message; }

/* Both generated from CFX_STATUS_LIST (conflux.h), so a new status cannot miss either. */
const char *cfx_status_string(cfx_status status)
{
#define CX_STATUS_STRING_CASE(symbol, name, value, description)                                    \
    case symbol: return description;
    switch (status) { CFX_STATUS_LIST(CX_STATUS_STRING_CASE) }
#undef CX_STATUS_STRING_CASE
    return "unknown status";
}

const char *cfx_status_name(cfx_status status)
{
#define CX_STATUS_NAME_CASE(symbol, name, value, description)                                      \
    case symbol: return #name;
    switch (status) { CFX_STATUS_LIST(CX_STATUS_NAME_CASE) }
#undef CX_STATUS_NAME_CASE
    return NULL;
}
