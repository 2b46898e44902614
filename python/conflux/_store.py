"""The engine's rendezvous store for the launchers in this package, through the C ABI.

There is one store implementation, the engine's TCP store (capi/src/rendezvous/store_tcp*.c,
public as cfx_store_* in conflux.h): the one cfxrun serves (tools/cfx-store) and every rank speaks
to. `StoreServer` serves it from a Python driver (conflux.spark's and conflux.ray's: their ranks get
CFX_RENDEZVOUS_ADDR and CFX_RENDEZVOUS_EXTERNAL=1); `on_set` and `on_close` let the launcher watch
its own keys (a task's start, failure and end) and the connections that set them (a task whose
process died). `StoreClient` is the launcher's side in each task. Neither speaks the protocol
itself.
"""
import logging
import threading
import time

from . import _capi

_LOG = logging.getLogger("conflux")
_EVENT_SLICE_S = 0.2  # how long the event thread waits at a time (close() waits at most this)


def _value(v):
    """A value as bytes: bytes-like as it is, anything else as its str's UTF-8."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    return str(v).encode()


def _pump(store, stop, on_set, on_close):
    """The event thread: pulls the served store's events (the GIL released while it waits) and
    calls on_set(key, value, conn_id) / on_close(conn_id) in the order they happened."""
    while not stop.is_set():
        try:
            event = _capi.cfx_py_store_next_event(store, _EVENT_SLICE_S)
        except Exception:  # noqa: BLE001  (the store is being freed: close() stops us first)
            _LOG.exception("conflux: reading the rendezvous store's events failed")
            return
        if event is None:
            continue
        kind, conn_id, key, value = event
        try:
            if kind == _capi.CFX_STORE_EVENT_SET and on_set is not None:
                on_set(key, value, conn_id)
            elif kind == _capi.CFX_STORE_EVENT_CLOSED and on_close is not None:
                on_close(conn_id)
        except Exception:  # noqa: BLE001  (a watcher's bug must not stop the events)
            _LOG.exception("conflux: a rendezvous store watcher raised")


class StoreServer:
    """Serves the store on `port` (0: a free one) of every interface, for every world the job
    forms, until close().

    on_set(key, value, conn_id): called after a client set a key (key a str, value bytes).
    on_close(conn_id): called when a client's connection ends (it closed it, or its process died).
    Both are called from one thread of the server's (there only when one is given), in the order
    things happened; keys set here (set()) call neither. A port that is taken raises
    conflux.ConfigError naming it.
    """

    def __init__(self, port=0, on_set=None, on_close=None):
        watch = on_set is not None or on_close is not None
        self._store = _capi.cfx_store_serve(int(port), 1 if watch else 0)
        self.port = _capi.cfx_store_port(self._store)
        self._lock = threading.Lock()  # close() against the calls below
        self._stop = threading.Event()
        self._events = None
        if watch:
            self._events = threading.Thread(target=_pump, name="conflux-store-events",
                                            daemon=True,
                                            args=(self._store, self._stop, on_set, on_close))
            self._events.start()

    def _served(self):
        if self._store is None:
            raise ValueError("the rendezvous store is closed")
        return self._store

    def get(self, key):
        """The value of `key` as bytes, or None while it is not set."""
        with self._lock:
            return _capi.cfx_py_store_get(self._served(), key)

    def set(self, key, value):
        """Sets a key from the serving side (a launcher's own marks: conflux.ray's elastic
        driver writes elastic/gone/<id> here); str values are encoded. No on_set for it."""
        with self._lock:
            _capi.cfx_store_set(self._served(), key, _value(value))

    def close(self):
        """Stops the event thread, then serving: every client's connection is closed."""
        self._stop.set()
        if self._events is not None and self._events is not threading.current_thread():
            self._events.join()
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            _capi.cfx_store_free(store)


class StoreClient:
    """One connection to a store: set, check, get, wait (polling, as the engine's client does)."""

    def __init__(self, host, port, timeout_s=30.0):
        self._store = _capi.cfx_store_connect(host, int(port), float(timeout_s))
        self._lock = threading.Lock()

    def _client(self):
        if self._store is None:
            raise ValueError("the connection to the rendezvous store is closed")
        return self._store

    def set(self, key, value):
        with self._lock:
            _capi.cfx_store_set(self._client(), key, _value(value))

    def check(self, key):
        return self.get(key) is not None

    def get(self, key):
        """The value of `key` as bytes, or None while it is not set."""
        with self._lock:
            return _capi.cfx_py_store_get(self._client(), key)

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
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            _capi.cfx_store_free(store)
