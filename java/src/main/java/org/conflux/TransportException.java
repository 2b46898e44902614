package org.conflux;

/** The transport (MPI) reported an error. */
public class TransportException extends ConfluxException {
    private static final long serialVersionUID = 1L;

    public TransportException(String message) {
        super(Status.TRANSPORT, message);
    }
}
