package org.conflux;

/** A peer rank exited or stopped answering. */
public class PeerLostException extends ConfluxException {
    private static final long serialVersionUID = 1L;

    public PeerLostException(String message) {
        super(Status.PEER_LOST, message);
    }
}
