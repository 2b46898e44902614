package org.conflux;

/**
 * The engine's side of a {@link Store} (cfxj_store_new in bindings/java/conflux_java.i calls these
 * methods from C): status codes instead of exceptions, and the first exception kept so that
 * {@link Conflux#initGroup} can attach it to the error it throws.
 */
final class StoreBridge {
    private final Store store;
    private volatile Throwable failure;

    StoreBridge(Store store) {
        this.store = store;
    }

    Throwable failure() {
        return failure;
    }

    private void failed(Throwable t) {
        if (failure == null) {
            failure = t;
        }
    }

    /** 0, or -1 after the store threw. */
    int set(String key, byte[] value) {
        try {
            store.set(key, value);
            return 0;
        } catch (Throwable t) {
            failed(t);
            return -1;
        }
    }

    /** The value, or null after the store threw (or returned null). */
    byte[] get(String key) {
        try {
            byte[] v = store.get(key);
            if (v == null) {
                failed(new IllegalStateException("Store.get(\"" + key + "\") returned null for a key that is set"));
            }
            return v;
        } catch (Throwable t) {
            failed(t);
            return null;
        }
    }

    /** 0 when every key is set, 1 when the deadline passed first, -1 after the store threw. */
    int await(String[] keys, double timeoutSeconds) {
        try {
            return store.await(keys, timeoutSeconds) ? 0 : 1;
        } catch (Throwable t) {
            failed(t);
            return -1;
        }
    }
}
