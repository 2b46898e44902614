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

const char *cfx_status_string(cfx_status status)
{
    switch (status) {
    case CFX_OK: return "ok";
    case CFX_ERR_INVALID_ARGUMENT: return "invalid argument";
    case CFX_ERR_NOT_INITIALIZED: return "not initialized";
    case CFX_ERR_SHUT_DOWN: return "shut down";
    case CFX_ERR_DUPLICATE_NAME: return "duplicate tensor name in flight";
    case CFX_ERR_MISMATCH: return "mismatch across ranks";
    case CFX_ERR_UNSUPPORTED: return "unsupported";
    case CFX_ERR_OUT_OF_MEMORY: return "out of memory";
    case CFX_ERR_TRANSPORT: return "transport error";
    case CFX_ERR_TIMEOUT: return "timed out";
    case CFX_ERR_IN_PROGRESS: return "in progress";
    case CFX_ERR_STALE_HANDLE: return "stale or unknown handle";
    case CFX_ERR_STALL: return "stalled: some ranks never submitted the tensor";
    case CFX_ERR_PEER_LOST: return "peer rank lost";
    case CFX_ERR_CONFIG: return "invalid configuration";
    case CFX_ERR_VERSION: return "incompatible version (options struct, or ranks that cannot talk)";
    case CFX_ERR_JOINED: return "not supported while ranks have joined";
    case CFX_ERR_INTERNAL: return "internal error";
    case CFX_ERR_CUDA: return "CUDA error";
    case CFX_ERR_NCCL: return "NCCL error";
    case CFX_ERR_MEMBERSHIP_CHANGED: return "the elastic world's membership changed";
    }
    return "unknown status";
}
