package org.conflux;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The engine's TCP rendezvous store as a {@link Store}: a client connection, and {@link #serve} for
 * the process that holds the keys. The protocol is the engine's own
 * ({@code capi/src/rendezvous/store_tcp.c}; {@code cfxrun --transport gloo} and
 * {@code conflux.spark} serve the same one), so a {@code TcpStore} also reaches a store they serve.
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
    private static final byte[] GREETING = "CFXSTORE1\n".getBytes(StandardCharsets.US_ASCII);
    private static final int KEY_LIMIT = 4096;
    private static final int VALUE_LIMIT = 256 << 20;

    private final Socket socket;
    private final DataInputStream in;
    private final DataOutputStream out;
    private final String where;

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
        long deadline = System.nanoTime() + (long) (connectTimeoutSeconds * 1e9);
        Socket s;
        while (true) {
            s = new Socket();
            try {
                s.connect(new InetSocketAddress(host, port), 10_000);
                break;
            } catch (IOException e) {
                s.close();
                if (System.nanoTime() > deadline) {
                    throw new IOException("TcpStore: cannot reach the rendezvous store at " + where
                            + ": " + e.getMessage(), e);
                }
                try {
                    Thread.sleep(100);
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw new IOException("TcpStore: interrupted connecting to " + where, ie);
                }
            }
        }
        socket = s;
        socket.setTcpNoDelay(true);
        in = new DataInputStream(new BufferedInputStream(socket.getInputStream()));
        out = new DataOutputStream(new BufferedOutputStream(socket.getOutputStream()));
        byte[] greeting = new byte[GREETING.length + 4];
        try {
            in.readFully(greeting);
        } catch (IOException e) {
            socket.close();
            throw new IOException("TcpStore: " + where
                    + " is not a Conflux rendezvous store (no greeting)", e);
        }
        if (!Arrays.equals(Arrays.copyOf(greeting, GREETING.length), GREETING)) {
            socket.close();
            throw new IOException("TcpStore: " + where
                    + " is not a Conflux rendezvous store (it does not greet with CFXSTORE1)");
        }
    }

    private void request(int op, String key) throws IOException {
        byte[] k = key.getBytes(StandardCharsets.UTF_8);
        out.writeByte(op);
        out.writeInt(k.length);
        out.write(k);
    }

    @Override
    public synchronized void set(String key, byte[] value) throws IOException {
        request('S', key);
        out.writeInt(value.length);
        out.write(value);
        out.flush();
        in.readByte();
    }

    /** Whether {@code key} is set. */
    public synchronized boolean check(String key) throws IOException {
        request('C', key);
        out.flush();
        return in.readByte() == 1;
    }

    /** The value of {@code key}, or null when it is not set. */
    @Override
    public synchronized byte[] get(String key) throws IOException {
        request('G', key);
        out.flush();
        if (in.readByte() != 1) {
            return null;
        }
        byte[] v = new byte[in.readInt()];
        in.readFully(v);
        return v;
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
    public void close() throws IOException {
        socket.close();
    }

    @Override
    public String toString() {
        return "TcpStore[" + where + "]";
    }

    /** Serves a store on {@code port} of every interface (0: a free port; {@link Server#port()}). */
    public static Server serve(int port) throws IOException {
        return new Server(port);
    }

    /** A store served from daemon threads of this process until {@link #close()}. */
    public static final class Server implements AutoCloseable {
        /* keys as ISO-8859-1 strings: byte for byte what the clients sent */
        private final Map<String, byte[]> data = new ConcurrentHashMap<>();
        private final Set<Socket> connections = ConcurrentHashMap.newKeySet();
        private final ServerSocket listener;

        private Server(int port) throws IOException {
            listener = new ServerSocket();
            listener.setReuseAddress(true);
            listener.bind(new InetSocketAddress(port), 1024);
            Thread t = new Thread(this::accept, "conflux-store-accept");
            t.setDaemon(true);
            t.start();
        }

        /** The port it listens on. */
        public int port() {
            return listener.getLocalPort();
        }

        private void accept() {
            while (true) {
                Socket c;
                try {
                    c = listener.accept();
                } catch (IOException e) {
                    return;
                }
                connections.add(c);
                Thread t = new Thread(() -> serve(c), "conflux-store");
                t.setDaemon(true);
                t.start();
            }
        }

        private static byte[] blob(DataInputStream in, int limit) throws IOException {
            int n = in.readInt();
            if (n < 0 || n > limit) {
                throw new IOException("TcpStore.Server: a request of " + n + " bytes");
            }
            byte[] b = new byte[n];
            in.readFully(b);
            return b;
        }

        private void serve(Socket c) {
            try (c) {
                c.setTcpNoDelay(true);
                DataInputStream in = new DataInputStream(new BufferedInputStream(c.getInputStream()));
                DataOutputStream out = new DataOutputStream(new BufferedOutputStream(c.getOutputStream()));
                out.write(GREETING);
                out.writeInt(0); // generation 0: every world the job forms
                out.flush();
                while (true) {
                    int op = in.read();
                    if (op < 0) {
                        return;
                    }
                    String key = new String(blob(in, KEY_LIMIT), StandardCharsets.ISO_8859_1);
                    if (op == 'S') {
                        data.put(key, blob(in, VALUE_LIMIT));
                        out.writeByte(1);
                    } else if (op == 'O') { // set once: the first value stays (store_tcp.c)
                        out.writeByte(data.putIfAbsent(key, blob(in, VALUE_LIMIT)) == null ? 1 : 0);
                    } else if (op == 'C') {
                        out.writeByte(data.containsKey(key) ? 1 : 0);
                    } else if (op == 'G') {
                        byte[] v = data.get(key);
                        if (v == null) {
                            out.writeByte(0);
                        } else {
                            out.writeByte(1);
                            out.writeInt(v.length);
                            out.write(v);
                        }
                    } else {
                        return;
                    }
                    out.flush();
                }
            } catch (EOFException | SocketException e) {
                // the client went away
            } catch (IOException e) {
                // a broken request ends its connection only
            } finally {
                connections.remove(c);
            }
        }

        /** Stops serving and closes every connection. */
        @Override
        public void close() throws IOException {
            listener.close();
            for (Socket c : connections) {
                try {
                    c.close();
                } catch (IOException e) {
                    // closing anyway
                }
            }
        }
    }
}
