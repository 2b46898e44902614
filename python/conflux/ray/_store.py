"""The job's rendezvous store, served by the Ray driver: the TCP store of
capi/src/rendezvous/store_tcp.c (the protocol tools/cfxrun's store speaks), so that workers given
CFX_RENDEZVOUS_ADDR=host:port with CFX_RENDEZVOUS_EXTERNAL=1 meet there (docs/launching.md).

On connect the server sends the greeting "CFXSTORE1\\n" and its generation (32-bit big-endian; 0:
it serves every world the job forms, init -> shutdown -> init and elastic rounds alike). Requests:
'S' klen key vlen value -> 1 byte; 'C' klen key -> 1 byte (set or not); 'G' klen key -> 1 byte,
then vlen value when set. A client waits for a key by polling 'C'. Python standard library only.
"""
import socket
import threading

GREETING = b"CFXSTORE1\n"


class StoreServer:
    """A TCP store on `port` (0: one the system picks) of every interface, served from daemon
    threads (one per connection) until close()."""

    def __init__(self, port=0):
        self.data = {}
        self.lock = threading.Lock()
        self._conns = set()
        self._closed = False
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("", port))
        except OSError as e:
            self.sock.close()
            raise RuntimeError("conflux.ray: cannot serve the rendezvous store on port %d: %s "
                               "(set CFX_RENDEZVOUS_PORT to a free port, or leave it unset)"
                               % (port, e.strerror)) from None
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="conflux-ray-store",
                                        daemon=True)
        self._thread.start()

    # ---- what the driver reads and writes directly (elastic: gone marks, decisions) ----
    def set(self, key, value):
        with self.lock:
            self.data[key if isinstance(key, bytes) else key.encode()] = \
                value if isinstance(value, bytes) else str(value).encode()

    def items(self):
        with self.lock:
            return list(self.data.items())

    def close(self):
        """Stops accepting and drops every connection (a worker still polling sees its store
        gone). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self.lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ---- the server ----
    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read(conn, n):
        buf = b""
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _blob(self, conn):
        n = int.from_bytes(self._read(conn, 4), "big")
        return self._read(conn, n)

    def _serve(self, conn):
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(GREETING + (0).to_bytes(4, "big"))
            while True:
                op = self._read(conn, 1)
                key = self._blob(conn)
                if op == b"S":
                    value = self._blob(conn)
                    with self.lock:
                        self.data[key] = value
                    conn.sendall(b"\x01")
                elif op == b"C":
                    with self.lock:
                        present = key in self.data
                    conn.sendall(b"\x01" if present else b"\x00")
                elif op == b"G":
                    with self.lock:
                        value = self.data.get(key)
                    conn.sendall(b"\x00" if value is None else
                                 b"\x01" + len(value).to_bytes(4, "big") + value)
                else:
                    return
        except (EOFError, OSError):
            pass
        finally:
            with self.lock:
                self._conns.discard(conn)
            conn.close()
