"""The engine's TCP rendezvous store, served and spoken from Python (standard library only).

The protocol is capi/src/rendezvous/store_tcp.c's (tools/cfxrun serves the same one): on connect
the server sends the greeting "CFXSTORE1\\n" and a 32-bit big-endian generation (0: it serves every
world a job forms); then requests, integers 32-bit big-endian: 'S' klen key vlen value -> 1 byte
(1); 'C' klen key -> 1 byte (1 set, 0 not); 'G' klen key -> 1 byte (set or not), then vlen value
when set; 'O' klen key vlen value -> 1 byte (1 set now, 0 it was set already and stays: the first
value wins, as a membership round's decision needs). 'S' overwrites; a client waits by polling
'C'.

`StoreServer` is what a launcher serves from a Python driver (conflux.spark's and conflux.ray's:
ranks get CFX_RENDEZVOUS_ADDR and CFX_RENDEZVOUS_EXTERNAL=1); `on_set` and `on_close` let the launcher watch its own keys (a task's
start, failure and end) and the connections that set them (a task whose process died). `StoreClient`
is the launcher's side in each task.
"""
import socket
import threading
import time

GREETING = b"CFXSTORE1\n"


def _read(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _blob(conn):
    return _read(conn, int.from_bytes(_read(conn, 4), "big"))


def _key(k):
    """A key as the wire has it: bytes (str keys are UTF-8)."""
    return k.encode() if isinstance(k, str) else k


def _pack(data):
    return len(data).to_bytes(4, "big") + data


class StoreServer:
    """Serves the store from daemon threads on `port` (0: a free one) of every interface.

    on_set(key, value, conn_id): called after a key is set, outside the store's lock.
    on_close(conn_id): called when a connection ends (the peer closed it, or its process died).
    """

    def __init__(self, port=0, on_set=None, on_close=None):
        self._data = {}
        self._lock = threading.Lock()
        self._on_set = on_set
        self._on_close = on_close
        self._conns = set()
        self._closed = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind(("", port))
        except OSError as e:
            self._sock.close()
            raise OSError(e.errno, f"cannot serve the rendezvous store on port {port}: "
                                   f"{e.strerror} (set CFX_RENDEZVOUS_PORT to a free port)") \
                from None
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]
        self._next_id = 0
        threading.Thread(target=self._accept, name="conflux-store-accept", daemon=True).start()

    def get(self, key):
        with self._lock:
            return self._data.get(_key(key))

    def set(self, key, value):
        """Sets a key from the serving side (a launcher's own marks: conflux.ray's elastic
        driver writes gone/<id> here); str keys and values are encoded."""
        with self._lock:
            self._data[_key(key)] = value if isinstance(value, bytes) else str(value).encode()

    def items(self):
        """Every (key, value) set so far, as bytes (a snapshot)."""
        with self._lock:
            return list(self._data.items())

    def close(self):
        """Stops accepting and closes every connection (their threads then end)."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
                self._next_id += 1
                conn_id = self._next_id
            threading.Thread(target=self._serve, args=(conn, conn_id), name="conflux-store",
                             daemon=True).start()

    def _serve(self, conn, conn_id):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            conn.sendall(GREETING + (0).to_bytes(4, "big"))
            while True:
                op = _read(conn, 1)
                key = _blob(conn)
                if op in (b"S", b"O"):
                    value = _blob(conn)
                    with self._lock:
                        stored = op == b"S" or key not in self._data
                        if stored:
                            self._data[key] = value
                    if stored and self._on_set:
                        self._on_set(key.decode(errors="replace"), value, conn_id)
                    conn.sendall(b"\x01" if stored else b"\x00")
                elif op == b"C":
                    with self._lock:
                        present = key in self._data
                    conn.sendall(b"\x01" if present else b"\x00")
                elif op == b"G":
                    with self._lock:
                        value = self._data.get(key)
                    conn.sendall(b"\x00" if value is None else b"\x01" + _pack(value))
                else:
                    return
        except (EOFError, OSError):
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            if self._on_close:
                self._on_close(conn_id)


class StoreClient:
    """One connection to a store: set, check, get, wait (polling, as the engine's client does)."""

    def __init__(self, host, port, timeout_s=30.0):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=timeout_s)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"cannot reach the rendezvous store at {host}:{port}: "
                                          f"{e.strerror or e}") from None
                time.sleep(0.2)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(None)
        greeting = _read(self._sock, len(GREETING) + 4)
        if greeting[:len(GREETING)] != GREETING:
            self._sock.close()
            raise ConnectionError(f"{host}:{port} is not a Conflux rendezvous store (it does not "
                                  "greet with CFXSTORE1)")
        self._lock = threading.Lock()

    def set(self, key, value):
        value = value.encode() if isinstance(value, str) else bytes(value)
        with self._lock:
            self._sock.sendall(b"S" + _pack(_key(key)) + _pack(value))
            _read(self._sock, 1)

    def check(self, key):
        with self._lock:
            self._sock.sendall(b"C" + _pack(_key(key)))
            return _read(self._sock, 1) == b"\x01"

    def get(self, key):
        """The value of `key`, or None while it is not set."""
        with self._lock:
            self._sock.sendall(b"G" + _pack(_key(key)))
            if _read(self._sock, 1) != b"\x01":
                return None
            return _blob(self._sock)

    def wait(self, key, timeout_s):
        """The value of `key` once it is set; TimeoutError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.get(key)
            if value is not None:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"the rendezvous store has no key {key!r} after {timeout_s} s")
            time.sleep(0.05)

    def close(self):
        try:
            self._sock.close()
        except OSError:
            pass
