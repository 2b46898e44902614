package org.conflux;

/** The C status codes, as carried by {@link ConfluxException#status()}. Codes are pinned. */
public enum Status {
    OK(cfx_status.CFX_OK),
    INVALID_ARGUMENT(cfx_status.CFX_ERR_INVALID_ARGUMENT),
    NOT_INITIALIZED(cfx_status.CFX_ERR_NOT_INITIALIZED),
    SHUT_DOWN(cfx_status.CFX_ERR_SHUT_DOWN),
    DUPLICATE_NAME(cfx_status.CFX_ERR_DUPLICATE_NAME),
    MISMATCH(cfx_status.CFX_ERR_MISMATCH),
    UNSUPPORTED(cfx_status.CFX_ERR_UNSUPPORTED),
    OUT_OF_MEMORY(cfx_status.CFX_ERR_OUT_OF_MEMORY),
    TRANSPORT(cfx_status.CFX_ERR_TRANSPORT),
    TIMEOUT(cfx_status.CFX_ERR_TIMEOUT),
    IN_PROGRESS(cfx_status.CFX_ERR_IN_PROGRESS),
    STALE_HANDLE(cfx_status.CFX_ERR_STALE_HANDLE),
    STALL(cfx_status.CFX_ERR_STALL),
    PEER_LOST(cfx_status.CFX_ERR_PEER_LOST),
    CONFIG(cfx_status.CFX_ERR_CONFIG),
    VERSION(cfx_status.CFX_ERR_VERSION),
    JOINED(cfx_status.CFX_ERR_JOINED),
    INTERNAL(cfx_status.CFX_ERR_INTERNAL),
    CUDA(cfx_status.CFX_ERR_CUDA),
    NCCL(cfx_status.CFX_ERR_NCCL),
    /** A code this version of the binding does not know (a newer library). */
    UNKNOWN(-1);

    /** The C value (cfx_status). */
    public final int code;

    Status(int code) {
        this.code = code;
    }

    /** The status for a C code; {@link #UNKNOWN} for one this binding does not know. */
    public static Status of(int code) {
        for (Status s : values()) {
            if (s.code == code) {
                return s;
            }
        }
        return UNKNOWN;
    }

    /** The C library's short description ("mismatch across ranks"). */
    public String description() {
        return ConfluxNative.cfx_status_string(code);
    }
}
