package org.conflux;

import java.io.IOException;

/**
 * A key-value store the members of a group meet through ({@link Conflux#initGroup}): each member
 * publishes its host name and its Gloo addresses under keys of its own and reads the others'. Keys
 * are set once and never deleted. {@link TcpStore} is the engine's own TCP store (the one
 * {@code cfxrun} serves); any store every member reaches works, e.g. one a cluster manager already
 * offers.
 *
 * <p>The engine calls a store from the thread in {@code initGroup} and may call it from its own
 * threads while the context lives, so an implementation must be thread-safe. An exception from a
 * method fails the engine's call; {@code initGroup} then throws with that exception attached.
 */
public interface Store {
    /** Sets {@code key} to {@code value}. */
    void set(String key, byte[] value) throws IOException;

    /** The value of {@code key}, which is set (the engine waits for it first). */
    byte[] get(String key) throws IOException;

    /**
     * Waits until every key is set: true when they are, false when {@code timeoutSeconds} passed
     * first ({@code 0}: look once, without waiting).
     */
    boolean await(String[] keys, double timeoutSeconds) throws IOException;

    /** This store with every key prefixed by {@code prefix}: several groups can share one store. */
    default Store withPrefix(String prefix) {
        if (prefix == null) {
            throw new IllegalArgumentException("Store.withPrefix: null prefix");
        }
        Store inner = this;
        return new Store() {
            @Override
            public void set(String key, byte[] value) throws IOException {
                inner.set(prefix + key, value);
            }

            @Override
            public byte[] get(String key) throws IOException {
                return inner.get(prefix + key);
            }

            @Override
            public boolean await(String[] keys, double timeoutSeconds) throws IOException {
                String[] full = new String[keys.length];
                for (int i = 0; i < keys.length; i++) {
                    full[i] = prefix + keys[i];
                }
                return inner.await(full, timeoutSeconds);
            }
        };
    }
}
