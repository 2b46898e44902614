"""The Python store server (conflux._store_server, served by the Ray and Spark drivers) speaks the
engine's TCP store protocol (capi/src/rendezvous/store_tcp.c), set-once included: a membership
round's decision is set once, and the first value stays."""
import socket

from conflux._store_server import GREETING, StoreServer, _pack


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
        # on_set hears of the value that was stored, not of the one set-once turned away
        assert seen == [("elastic/r2/decision", b"ok 0 1"), ("beat/0", b"1"), ("beat/0", b"2")]
    finally:
        server.close()
