package org.conflux;

/**
 * An elastic world was formed again while the call was pending, or could not be formed (fewer
 * than the minimum by the round's deadline); the message names who left or who was missing
 * (docs/elastic.md).
 */
public class MembershipChangedException extends ConfluxException {
    private static final long serialVersionUID = 1L;

    public MembershipChangedException(String message) {
        super(Status.MEMBERSHIP_CHANGED, message);
    }
}
