package org.conflux;

/** The context was shut down, locally or by another rank. */
public class ShutDownException extends ConfluxException {
    private static final long serialVersionUID = 1L;

    public ShutDownException(String message) {
        super(Status.SHUT_DOWN, message);
    }
}
