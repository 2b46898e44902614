package org.conflux;

/** Some ranks never submitted the tensor before the stall deadline. */
public class StallException extends ConfluxException {
    private static final long serialVersionUID = 1L;

    public StallException(String message) {
        super(Status.STALL, message);
    }
}
