package org.conflux;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.OutputStream;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * Conflux.initGroup over a Store, and TcpStore (client and server): groups made in this JVM alone,
 * one thread per member, each member a context of its own (what a Spark executor running two
 * barrier tasks holds). Nothing here uses the shared world, so the ranks of the suite do not meet.
 */
@TestMethodOrder(MethodOrderer.MethodName.class)
class GroupStoreTest {

    private static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    @Test
    void a01_tcpStoreSetsGetsAndWaits() throws Exception {
        try (TcpStore.Server server = TcpStore.serve(0);
             TcpStore a = new TcpStore("127.0.0.1", server.port());
             TcpStore b = new TcpStore("127.0.0.1", server.port())) {
            assertTrue(server.port() > 0);
            assertNull(b.get("k"));
            assertFalse(b.check("k"));
            assertFalse(b.await(new String[] {"k"}, 0.05));
            a.set("k", bytes("value"));
            byte[] big = new byte[1 << 20];
            big[12345] = 7;
            a.set("big", big);
            assertTrue(b.check("k"));
            assertArrayEquals(bytes("value"), b.get("k"));
            assertArrayEquals(big, b.get("big"));
            assertTrue(b.await(new String[] {"k", "big"}, 0.0));
            Store prefixed = a.withPrefix("job7/");
            prefixed.set("x", bytes("1"));
            assertArrayEquals(bytes("1"), b.get("job7/x"));
            assertArrayEquals(bytes("1"), b.withPrefix("job7/").get("x"));
            assertTrue(b.withPrefix("job7/").await(new String[] {"x"}, 1.0));
        }
    }

    @Test
    void a02_tcpStoreRefusesWhatIsNoStore() throws Exception {
        try (ServerSocket other = new ServerSocket(0)) {
            Thread t = new Thread(() -> {
                try (Socket s = other.accept(); OutputStream out = s.getOutputStream()) {
                    out.write(bytes("HTTP/1.1 400 Bad Request\r\n\r\n"));
                    out.flush();
                    Thread.sleep(200);
                } catch (IOException | InterruptedException e) {
                    // the client has gone
                }
            });
            t.start();
            IOException e = assertThrows(IOException.class,
                    () -> new TcpStore("127.0.0.1", other.getLocalPort(), 5.0).close());
            assertTrue(e.getMessage().contains("is not a Conflux rendezvous store"), e.getMessage());
            t.join();
        }
        // nothing listens: fails after the connect deadline, naming the address
        int port;
        try (ServerSocket free = new ServerSocket(0)) {
            port = free.getLocalPort();
        }
        final int closed = port;
        IOException e = assertThrows(IOException.class, () -> new TcpStore("127.0.0.1", closed, 0.3).close());
        assertTrue(e.getMessage().contains("cannot reach the rendezvous store at 127.0.0.1:" + closed), e.getMessage());
    }

    /** What each member of a group computed: its place and the collectives' results. */
    private record Seen(int rank, int size, int localRank, int localSize, double[] sum, double[] grad) {
    }

    private static Seen member(Store store, int rank, int size) {
        try (Conflux cfx = Conflux.initGroup(new Conflux.Options().stallTimeoutSeconds(60), store, rank, size)) {
            double[] x = {rank + 1.0, 10.0 * (rank + 1)};
            cfx.allreduce("x", x, ReduceOp.SUM);
            double[] grad = new double[3];
            try (GradientSet gs = new GradientSet(cfx, "g", new GradientSet.Options().op(ReduceOp.AVERAGE))) {
                int i = gs.add("w", new long[] {3}, DType.FLOAT64);
                gs.commit();
                ByteBuffer b = gs.buffer(i).order(ByteOrder.nativeOrder());
                DoubleBuffer d = b.asDoubleBuffer();
                for (int k = 0; k < 3; k++) {
                    d.put(k, rank * 3 + k);
                }
                gs.ready(i);
                gs.await();
                d.get(0, grad);
            }
            return new Seen(cfx.rank(), cfx.size(), cfx.localRank(), cfx.localSize(), x, grad);
        }
    }

    @Test
    void a03_aGroupOfThreadsMeetsThroughATcpStore() throws Exception {
        int size = 3;
        ExecutorService pool = Executors.newFixedThreadPool(size);
        try (TcpStore.Server server = TcpStore.serve(0)) {
            List<Future<Seen>> futures = new ArrayList<>();
            for (int r = 0; r < size; r++) {
                final int rank = r;
                futures.add(pool.submit(() -> {
                    try (TcpStore store = new TcpStore("127.0.0.1", server.port())) {
                        return member(store, rank, size);
                    }
                }));
            }
            for (int r = 0; r < size; r++) {
                Seen s = futures.get(r).get(120, TimeUnit.SECONDS);
                assertEquals(r, s.rank());
                assertEquals(size, s.size());
                assertEquals(r, s.localRank());
                assertEquals(size, s.localSize());
                assertArrayEquals(new double[] {6.0, 60.0}, s.sum());
                assertArrayEquals(new double[] {3.0, 4.0, 5.0}, s.grad()); // mean of 3r + k over r = 0..2
            }
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    void a04_aGroupOfOneMeetsNobody() {
        Store untouched = new Store() {
            @Override
            public void set(String key, byte[] value) {
                throw new AssertionError("a group of one used its store");
            }

            @Override
            public byte[] get(String key) {
                throw new AssertionError("a group of one used its store");
            }

            @Override
            public boolean await(String[] keys, double timeoutSeconds) {
                throw new AssertionError("a group of one used its store");
            }
        };
        try (Conflux cfx = Conflux.initGroup(untouched, 0, 1)) {
            double[] x = {4.0};
            cfx.allreduce("x", x, ReduceOp.SUM);
            assertEquals(4.0, x[0]);
            assertEquals(1, cfx.size());
        }
    }

    @Test
    void a05_badArgumentsAndAFailingStore() {
        assertThrows(IllegalArgumentException.class, () -> Conflux.initGroup(null, 0, 2));
        IllegalArgumentException range = assertThrows(IllegalArgumentException.class,
                () -> Conflux.initGroup(new Conflux.Options(), new MemoryStore(), 2, 2));
        assertTrue(range.getMessage().contains("rank 2 of size 2"), range.getMessage());
        assertThrows(IllegalArgumentException.class, () -> Conflux.initGroup(new MemoryStore(), 0, 0));
        IOException broken = new IOException("the store is down");
        Store failing = new MemoryStore() {
            @Override
            public void set(String key, byte[] value) throws IOException {
                throw broken;
            }
        };
        RuntimeException e = assertThrows(RuntimeException.class, () -> Conflux.initGroup(failing, 0, 2));
        assertEquals(1, e.getSuppressed().length, e.toString());
        assertSame(broken, e.getSuppressed()[0]);
    }

    /** A store that holds keys in memory and never waits. */
    private static class MemoryStore implements Store {
        private final java.util.Map<String, byte[]> data = new java.util.concurrent.ConcurrentHashMap<>();

        @Override
        public void set(String key, byte[] value) throws IOException {
            data.put(key, value);
        }

        @Override
        public byte[] get(String key) {
            return data.get(key);
        }

        @Override
        public boolean await(String[] keys, double timeoutSeconds) {
            for (String k : keys) {
                if (!data.containsKey(k)) {
                    return false;
                }
            }
            return true;
        }
    }
}
