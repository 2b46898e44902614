package org.conflux;

import java.io.IOException;

/**
 * The engine's TCP rendezvous store as a {@link Store}: a client connection, and {@link #serve} for
 * the process that holds the keys. Both are the engine's own store ({@code cfx_store_*} of the C
 * API: the one {@code cfxrun --transport gloo}, {@code conflux.spark} and {@code conflux.ray}
 * serve), so a {@code TcpStore} reaches a store they serve and they reach one served here.
 *
 * <pre>{@code
 * try (TcpStore.Server server = rank == 0 ? TcpStore.serve(0) : null;    // on one member
 *      TcpStore store = new TcpStore(host, port);                          // on every member
 *      Conflux cfx = Conflux.initGroup(store, rank, size)) {
 *     ...
 * }
 * }</pre>
 *
 * <p>Thread-safe: one request at a time on the connection.
 */
public final class TcpStore implements Store, AutoCloseable {
    private final String where;
    private long store; // the cfx_store *, 0 once closed

    /** Connects to the store at host:port, retrying for up to 30 s while it is not yet served. */
    public TcpStore(String host, int port) throws IOException {
        this(host, port, 30.0);
    }

    /**
     * Connects to the store at host:port, retrying for up to {@code connectTimeoutSeconds} while
     * nothing listens there yet.
     *
     * @throws IOException when it cannot connect by then, or what answers is not a Conflux store
     */
    public TcpStore(String host, int port, double connectTimeoutSeconds) throws IOException {
        where = host + ":" + port;
        store = ConfluxNative.cfxj_tcpstore_connect(host, port, connectTimeoutSeconds);
        if (store == 0) {
            throw new IOException("TcpStore: "
                    + (ConfluxNative.cfxj_last_status() == cfx_status.CFX_ERR_CONFIG
                            ? where + " is not a Conflux rendezvous store"
                            : "cannot reach the rendezvous store at " + where)
                    + ": " + ConfluxNative.cfx_last_error());
        }
    }

    private long open() throws IOException {
        if (store == 0) {
            throw new IOException("TcpStore: the connection to " + where + " is closed");
        }
        return store;
    }

    @Override
    public synchronized void set(String key, byte[] value) throws IOException {
        int status = ConfluxNative.cfxj_tcpstore_set(open(), key, value);
        if (status != cfx_status.CFX_OK) {
            throw new IOException("TcpStore: setting \"" + key + "\": " + ConfluxNative.cfx_last_error());
        }
    }

    /** Whether {@code key} is set. */
    public boolean check(String key) throws IOException {
        return get(key) != null;
    }

    /** The value of {@code key}, or null when it is not set. */
    @Override
    public synchronized byte[] get(String key) throws IOException {
        byte[] value = ConfluxNative.cfxj_tcpstore_get(open(), key);
        if (value == null && ConfluxNative.cfxj_last_status() != cfx_status.CFX_OK) {
            throw new IOException("TcpStore: reading \"" + key + "\": " + ConfluxNative.cfx_last_error());
        }
        return value;
    }

    /** Polls until every key is set (true) or the deadline passed (false). */
    @Override
    public boolean await(String[] keys, double timeoutSeconds) throws IOException {
        long deadline = System.nanoTime() + (long) (timeoutSeconds * 1e9);
        long pauseMs = 1;
        int next = 0;
        while (true) {
            while (next < keys.length && check(keys[next])) {
                next++;
            }
            if (next == keys.length) {
                return true;
            }
            if (System.nanoTime() >= deadline) {
                return false;
            }
            try {
                Thread.sleep(pauseMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IOException("TcpStore: interrupted waiting for " + keys[next], e);
            }
            pauseMs = Math.min(pauseMs * 2, 20);
        }
    }

    @Override
    public synchronized void close() throws IOException {
        ConfluxNative.cfxj_tcpstore_free(store);
        store = 0;
    }

    @Override
    public String toString() {
        return "TcpStore[" + where + "]";
    }

    /** Serves a store on {@code port} of every interface (0: a free port; {@link Server#port()}). */
    public static Server serve(int port) throws IOException {
        return new Server(port);
    }

    /** The engine's store served from a thread of this process until {@link #close()}. */
    public static final class Server implements AutoCloseable {
        private long store; // the cfx_store *, 0 once closed
        private final int port;

        private Server(int port) throws IOException {
            store = ConfluxNative.cfxj_tcpstore_serve(port);
            if (store == 0) {
                throw new IOException("TcpStore.serve: " + ConfluxNative.cfx_last_error());
            }
            this.port = ConfluxNative.cfxj_tcpstore_port(store);
        }

        /** The port it listens on. */
        public int port() {
            return port;
        }

        /** Stops serving and closes every connection. */
        @Override
        public synchronized void close() throws IOException {
            ConfluxNative.cfxj_tcpstore_free(store);
            store = 0;
        }
    }
}
