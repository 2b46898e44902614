package org.conflux;

/** The collective cannot run while some ranks have joined. */
public class JoinedException extends ConfluxException {
    private static final long serialVersionUID = 1L;

    public JoinedException(String message) {
        super(Status.JOINED, message);
    }
}
