package org.conflux;

/**
 * A failure reported by the Conflux engine, carrying its {@link Status} and the C message
 * ({@code cfx_last_error()} or the handle's message), which names the tensor and the ranks involved.
 * Subclasses cover the cases a trainer may want to handle: {@link MismatchException},
 * {@link StallException}, {@link PeerLostException}, {@link ShutDownException},
 * {@link DuplicateNameException}, {@link TransportException}, {@link JoinedException},
 * {@link TimeoutException}, {@link MembershipChangedException}. Bad local arguments are
 * {@link IllegalArgumentException}s instead.
 */
public class ConfluxException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final Status status;
    private final String statusName;

    public ConfluxException(Status status, String message) {
        this(status, status.name(), message);
    }

    ConfluxException(Status status, String statusName, String message) {
        super(message == null || message.isEmpty() ? status.description() : message);
        this.status = status;
        this.statusName = statusName;
    }

    /** The machine-readable kind of failure. */
    public Status status() {
        return status;
    }

    /**
     * The C library's name of the status ({@code cfx_status_name}: "MISMATCH"), also for a status
     * of a newer library that {@link Status} does not name ({@link Status#UNKNOWN}).
     */
    public String statusName() {
        return statusName;
    }

    /**
     * True when the failure means that the world this rank was in is gone (a peer lost, the
     * transport broken, a shutdown, or the membership changed): in an elastic job
     * ({@link Conflux#elasticInit}) the survivors go on after {@link Conflux#reform()}.
     */
    public boolean worldChanged() {
        return status == Status.PEER_LOST || status == Status.TRANSPORT || status == Status.SHUT_DOWN
                || status == Status.MEMBERSHIP_CHANGED;
    }

    /** Maps a C status and message to the Java exception a caller sees. */
    static RuntimeException of(int code, String message) {
        Status s = Status.of(code);
        switch (s) {
            case INVALID_ARGUMENT:
                return new IllegalArgumentException(message);
            case NOT_INITIALIZED:
            case STALE_HANDLE:
                return new IllegalStateException(message);
            case SHUT_DOWN:
                return new ShutDownException(message);
            case DUPLICATE_NAME:
                return new DuplicateNameException(message);
            case MISMATCH:
                return new MismatchException(message);
            case STALL:
                return new StallException(message);
            case PEER_LOST:
                return new PeerLostException(message);
            case TRANSPORT:
                return new TransportException(message);
            case JOINED:
                return new JoinedException(message);
            case TIMEOUT:
                return new TimeoutException(message);
            case MEMBERSHIP_CHANGED:
                return new MembershipChangedException(message);
            default:
                String name = ConfluxNative.cfx_status_name(code);
                return new ConfluxException(s, name != null ? name : s.name(),
                        message + (s == Status.UNKNOWN ? " (status " + code + (name != null ? " " + name : "") + ")" : ""));
        }
    }
}
