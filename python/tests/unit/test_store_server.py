"""The store the Ray and Spark drivers serve (conflux._store.StoreServer: the engine's TCP store
through cfx_store_serve) answers the protocol's set-once request as the engine's clients expect
(capi/src/rendezvous/store_tcp_wire.h): a membership round's decision is set once, the first value
stays, and on_set hears of the value stored, not of the one set-once turned away."""
import socket
import time

from conflux._store import StoreServer

GREETING = b"CFXSTORE1\n"  # then a 32-bit generation


def _pack(data):
    return len(data).to_bytes(4, "big") + data


def _request(sock, op, key, value=None):
    sock.sendall(op + _pack(key) + (b"" if value is None else _pack(value)))
    return sock.recv(1)


def test_set_once_keeps_the_first_value_and_set_overwrites():
    seen = []
    server = StoreServer(on_set=lambda key, value, conn: seen.append((key, value)))
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            hello = b""
            while len(hello) < len(GREETING) + 4:
                hello += sock.recv(64)
            assert hello.startswith(GREETING)
            assert _request(sock, b"O", b"elastic/r2/decision", b"ok 0 1") == b"\x01"
            assert _request(sock, b"O", b"elastic/r2/decision", b"ok 1") == b"\x00"
            assert _request(sock, b"S", b"beat/0", b"1") == b"\x01"
            assert _request(sock, b"S", b"beat/0", b"2") == b"\x01"
        assert server.get("elastic/r2/decision") == b"ok 0 1"
        assert server.get("beat/0") == b"2"
        want = [("elastic/r2/decision", b"ok 0 1"), ("beat/0", b"1"), ("beat/0", b"2")]
        deadline = time.monotonic() + 10  # events reach on_set from the server's event thread
        while len(seen) < len(want) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == want
    finally:
        server.close()
