package org.conflux;

/**
 * The C status codes, as carried by {@link ConfluxException#status()}. Each constant is the C
 * library's status of the same name ({@code cfx_status_name}: {@code CFX_ERR_MISMATCH} is
 * {@code "MISMATCH"}); its code and description are read from the library when this class loads,
 * so they cannot drift from the C list. A status of a newer library that this enum does not name
 * is {@link #UNKNOWN}; {@link ConfluxException#statusName()} still names it.
 */
public enum Status {
    OK,
    INVALID_ARGUMENT,
    NOT_INITIALIZED,
    SHUT_DOWN,
    DUPLICATE_NAME,
    MISMATCH,
    UNSUPPORTED,
    OUT_OF_MEMORY,
    TRANSPORT,
    TIMEOUT,
    IN_PROGRESS,
    STALE_HANDLE,
    STALL,
    PEER_LOST,
    CONFIG,
    VERSION,
    JOINED,
    INTERNAL,
    CUDA,
    NCCL,
    /** An elastic world was formed again, or could not be (docs/elastic.md). */
    MEMBERSHIP_CHANGED,
    /** A code this version of the binding does not know (a newer library). */
    UNKNOWN;

    /** The C value (cfx_status); -1 for {@link #UNKNOWN}. */
    public final int code;

    Status() {
        this.code = codeOf(name());
    }

    /** The C code whose cfx_status_name is {@code name}, or -1. */
    private static int codeOf(String name) {
        NativeLoader.load();
        for (int c = 0; ; c++) {
            String n = ConfluxNative.cfx_status_name(c);
            if (n == null) {
                return -1;
            }
            if (n.equals(name)) {
                return c;
            }
        }
    }

    /** The status for a C code; {@link #UNKNOWN} for one this binding does not know. */
    public static Status of(int code) {
        for (Status s : values()) {
            if (s.code == code && s != UNKNOWN) {
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
