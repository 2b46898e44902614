"""Machinery shared by the numpy API, conflux.torch and conflux.horovod.torch.

Owns the module-level context (created by init(), freed by shutdown()), the Handle objects that wrap
a cfx_handle, and the exception classes. Collectives are submitted through submit(): the caller
passes the low-level function from conflux._capi, its arguments (tensor descriptions are tuples
`(address, dtype, shape[, device[, stream]])`), the objects that must stay alive until the collective
completes, and a function that turns the completed handle into the result. Shared tensor memory
(cfx_alloc) is handed out here too, as numpy arrays that keep the block alive. The collectives'
arguments (ops, compression, the checks) are conflux._args'; the ops are re-exported here, with the
rest of the API the facades take from this module.
"""
import atexit
import contextlib
import threading
import weakref

import numpy as _np

from . import _capi
from . import _capi_native as _native
from ._args import (  # noqa: F401  (the ops: part of the API every facade re-exports)
    Adasum, Average, Compression, Max, Min, Product, Sum, check_compression, check_scale)

# ---- exceptions ----
# The SWIG module creates ConfluxError and one subclass per status of the C library's list
# (cfx_status_name: MISMATCH -> MismatchError), in status order; they are this module's attributes
# and the package's by the same names.
ConfluxError = _native.ConfluxError
STATUS_ERRORS = _native.ERROR_CLASSES
globals().update((cls.__name__, cls) for cls in STATUS_ERRORS)
# The ones this module raises itself, by name.
NotInitializedError, ShutDownError = _native.NotInitializedError, _native.ShutDownError
WaitTimeoutError, OutOfMemoryError = _native.WaitTimeoutError, _native.OutOfMemoryError


class DtypeError(TypeError, ValueError):
    """An array/tensor dtype Conflux does not support. A TypeError, and a ValueError as Horovod
    raises for unsupported tensor types, so either `except` works."""


DtypeError.__module__ = "conflux"

# The public names of _core that conflux and conflux.torch export (besides the errors).
BASE_NAMES = (
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "version", "features", "start_timeline", "stop_timeline", "timeline",
    "Sum", "Average", "Min", "Max", "Product", "Adasum",
    "reform", "membership_round", "member_id", "membership_pending",
)

ERROR_NAMES = ("DtypeError", "ConfluxError") + tuple(cls.__name__ for cls in STATUS_ERRORS)

# ---- the context ----
class _Context:
    """One cfx_context. `ptr` is None once freed; handles check `alive` before touching it.
    `address` is the pointer as an int, for native code that takes it so (conflux._torch_native).
    `world` counts the worlds it had: reform() adds one."""

    __slots__ = ("ptr", "address", "world", "__weakref__")

    def __init__(self, ptr):
        self.ptr = ptr
        self.address = int(ptr) if ptr is not None else 0
        self.world = 0

    @property
    def alive(self):
        return self.ptr is not None


_lock = threading.RLock()
_ctx = None          # the current _Context, or None
# Called by init() before it forms a new world (it raises to refuse): a launcher's check that the
# world may still be formed (conflux.ray's worker: its run has not already failed elsewhere).
_before_new_world = None
_orphans = []        # (ctx, handle id, kept objects) of handles garbage-collected while pending


def init(**options):
    """Joins the job (collective). A second call while initialized does nothing; after shutdown()
    it creates a new context. Keyword options are fields of cfx_init_options (fusion_threshold_bytes,
    cycle_time_ms, cache_capacity, log_level, deterministic, stall_warning_s, stall_timeout_s,
    chunk_bytes, transport); unset ones come from CFX_* variables or the defaults."""
    global _ctx
    with _lock:
        if _ctx is not None:
            if _capi.cfx_is_running(_ctx.ptr):
                return
            _free_context()  # shut down by another rank: start again
        if _before_new_world is not None:
            _before_new_world()
        opts = None
        if options:
            opts = _capi.cfx_init_options()
            _capi.cfx_init_options_init(opts, _capi.CFX_INIT_OPTIONS_VERSION)
            for key, value in options.items():  # by name, as every binding sets them
                _capi.cfx_py_init_option(opts, key, check_scale(value, key))
        # Under cfxrun --elastic (CFX_ELASTIC=1) cfx_init joins the elastic job (docs/elastic.md).
        _ctx = _Context(_capi.cfx_init(opts))


# ---- elastic worlds (docs/elastic.md) ----
def reform_options(min_size=None, max_size=None, timeout_s=None, settle_s=None):
    """cfx_reform_options: given values, else the library's (which reads CFX_ELASTIC_MIN_SIZE /
    CFX_ELASTIC_MAX_SIZE, set by cfxrun --elastic from --min-np / --max-np)."""
    o = _capi.cfx_reform_options()
    _capi.cfx_reform_options_init(o, _capi.CFX_REFORM_OPTIONS_VERSION)
    if min_size is not None:
        o.min_size = int(min_size)
    if max_size is not None:
        o.max_size = int(max_size)
    if timeout_s is not None:
        o.timeout_s = float(timeout_s)
    if settle_s is not None:
        o.settle_s = float(settle_s)
    return o


_reform_listeners = []  # weak references to what on_reform() registered, in that order


def on_reform(listener):
    """Has reform() call listener._world_reformed() once each new world formed (held weakly; in
    the order they registered, which is the same on every rank). What the new world needs from a
    survivor before anything else runs, as a newcomer does it at its start (an optimizer's
    gradient sets, committed again), goes there."""
    _reform_listeners.append(weakref.ref(listener))


def reform(**options):
    """Forms the elastic world again (cfx_context_reform): pending collectives fail with
    MembershipChangedError (or the PeerLostError that ended the old world); rank() and size() may
    change; then what on_reform() registered catches up with the new world. Call it on every
    surviving rank."""
    with _lock:
        ctx = current()
        del _orphans[:]  # every pending handle has completed with an error by now
        _capi.cfx_context_reform(ctx.ptr, reform_options(**options))
        ctx.world += 1
        listeners = [ref() for ref in _reform_listeners]
        _reform_listeners[:] = [ref for ref, live in zip(_reform_listeners, listeners) if live]
    for listener in listeners:
        if listener is not None:
            listener._world_reformed()


def membership_round():
    """The membership round of the current world (1 for the first)."""
    return _capi.cfx_membership_round(current().ptr)


def member_id():
    """This process's member id in the elastic job."""
    return _capi.cfx_member_id(current().ptr)


def membership_pending():
    """How many newcomers wait for the next round, as this rank sees the store (agree with a
    collective before acting on it)."""
    return _capi.cfx_membership_pending(current().ptr)


def _free_context():
    global _ctx
    ctx, _ctx = _ctx, None
    if ctx is None:
        return
    try:
        _capi.cfx_shutdown(ctx.ptr)
    except ConfluxError:
        pass
    # After cfx_shutdown every pending handle has completed: nothing borrows memory any more.
    del _orphans[:]
    ptr, ctx.ptr = ctx.ptr, None
    _capi.cfx_context_free(ptr)


def shutdown():
    """Shuts Conflux down (pending collectives fail with ShutDownError) and frees the context.
    Idempotent; init() may be called again afterwards."""
    with _lock:
        _free_context()


atexit.register(shutdown)


def is_initialized():
    ctx = _ctx
    return ctx is not None and ctx.alive and bool(_capi.cfx_is_running(ctx.ptr))


def current():
    """The live context, or NotInitializedError."""
    ctx = _ctx
    if ctx is None or not ctx.alive:
        raise NotInitializedError("Conflux has not been initialized; use conflux.init().")
    return ctx


def _topology(fn):
    return fn(current().ptr)


def rank():
    return _topology(_capi.cfx_rank)


def size():
    return _topology(_capi.cfx_size)


def local_rank():
    return _topology(_capi.cfx_local_rank)


def local_size():
    return _topology(_capi.cfx_local_size)


def cross_rank():
    return _topology(_capi.cfx_cross_rank)


def cross_size():
    return _topology(_capi.cfx_cross_size)


def transport_name():
    """The transport the live context runs over, by the engine's name for it ("mpi", "gloo",
    "local", ...): the bindings ask the engine rather than reading CFX_TRANSPORT."""
    return _topology(_capi.cfx_transport_name)


def version():
    """The library's version string, e.g. "1.4.0"."""
    return _capi.cfx_version_string()


FEATURE_BITS = {
    "mpi": _capi.CFX_FEATURE_MPI,
    "cuda": _capi.CFX_FEATURE_CUDA,
    "nccl": _capi.CFX_FEATURE_NCCL,
    "cuda_device": _capi.CFX_FEATURE_CUDA_DEVICE,
    "local": _capi.CFX_FEATURE_LOCAL,
}


def features():
    """What this build supports and this machine offers: {"mpi": bool, "cuda": bool, "nccl": bool,
    "cuda_device": bool, "local": bool}."""
    bits = _capi.cfx_features()
    return {name: bool(bits & bit) for name, bit in FEATURE_BITS.items()}


def start_timeline(file_path, mark_cycles=False):
    """Starts writing this rank's timeline (Chrome trace JSON) to `file_path` with the rank inserted
    ("%r" is replaced by the rank, else ".rank<r>" goes before the extension). Not collective."""
    if not isinstance(file_path, str) or not file_path:
        raise ValueError("file_path must be a non-empty str")
    _capi.cfx_timeline_start(current().ptr, file_path, 1 if mark_cycles else 0)


def stop_timeline():
    """Stops the timeline and completes its file; a no-op when none runs."""
    _capi.cfx_timeline_stop(current().ptr)


@contextlib.contextmanager
def timeline(file_path, mark_cycles=False):
    """A context manager: start_timeline(file_path, mark_cycles) on entry, stop_timeline() on exit,
    also when the body raises, so the file is complete whatever happens inside.

        with conflux.timeline("trace/step.json"):
            train_one_epoch()
    """
    start_timeline(file_path, mark_cycles)
    try:
        yield
    finally:
        stop_timeline()


# ---- handles ----
def _reap_orphans():
    if not _orphans:
        return
    with _lock:
        keep = []
        for ctx, hid, kept in _orphans:
            if not ctx.alive:
                continue
            try:
                done = _capi.cfx_poll(ctx.ptr, hid)
            except ConfluxError:
                done = 1
            except ValueError:
                done = 1
            if done:
                try:
                    _capi.cfx_handle_release(ctx.ptr, hid)
                except (ConfluxError, ValueError):
                    pass
            else:
                keep.append((ctx, hid, kept))
        _orphans[:] = keep


class Handle:
    """An in-flight collective. poll() tells whether it completed; wait() (or conflux.synchronize)
    returns its result or raises its error. The handle keeps the arrays/tensors it uses alive until
    it completes; a handle dropped while pending is parked until its collective finishes."""

    __slots__ = ("_ctx", "_id", "_keep", "_finish", "_state", "_value", "_lock", "op", "name",
                 "__weakref__")

    def __init__(self, ctx, hid, keep, finish, op, name):
        self._ctx = ctx
        self._id = hid
        self._keep = keep
        self._finish = finish
        self._state = 0      # 0 pending, 1 result in _value, 2 exception in _value
        self._value = None
        self._lock = threading.Lock()
        self.op = op
        self.name = name

    def __repr__(self):
        state = ("pending", "done", "failed")[self._state]
        return "<conflux.Handle %s %s %s>" % (self.op, self.name or "(unnamed)", state)

    def poll(self):
        """True once the collective completed (successfully or not); never blocks."""
        if self._state:
            return True
        if not self._ctx.alive:
            return True
        return bool(_capi.cfx_poll(self._ctx.ptr, self._id))

    # Readers for finish functions (valid until wait() releases the handle).
    def output(self, index, allocate):
        """Copies output `index` into a new buffer made by allocate(dtype, shape) -> (obj, address,
        nbytes) and returns obj."""
        _, dtype, shape, _ = _capi.cfx_handle_output(self._ctx.ptr, self._id, index)
        obj, address, nbytes = allocate(dtype, shape)
        if nbytes:
            _capi.cfx_handle_output_copy(self._ctx.ptr, self._id, index, address, nbytes)
        return obj

    def output_count(self):
        return _capi.cfx_handle_output_count(self._ctx.ptr, self._id)

    def splits(self, index=0):
        return list(_capi.cfx_handle_splits(self._ctx.ptr, self._id, index))

    def join_rank(self):
        return _capi.cfx_handle_join_rank(self._ctx.ptr, self._id)

    def wait(self, timeout=None):
        """Blocks until completion (GIL released) and returns the result; raises the collective's
        error (a ConfluxError subclass with the engine's message) on every call after a failure.
        With a timeout (seconds) a WaitTimeoutError leaves the handle pending."""
        with self._lock:
            if self._state == 0:
                self._complete(-1.0 if timeout is None else float(timeout))
            if self._state == 2:
                raise self._value
            return self._value

    def _complete(self, timeout_s):
        ctx = self._ctx
        if not ctx.alive:
            self._state, self._value = 2, ShutDownError(
                "Conflux was shut down before this %s completed" % self.op)
            self._keep = None
            return
        try:  # the extension's function itself, not _capi's wrapper: a frame less on every wait
            _native.cfx_py_wait(ctx.ptr, self._id, timeout_s)
        except WaitTimeoutError:
            raise
        except BaseException as exc:
            if not isinstance(exc, (ConfluxError, ValueError)):
                raise  # KeyboardInterrupt etc.: the handle stays pending
            self._state, self._value = 2, exc
            self._release()
            return
        try:
            value = self._finish(self) if self._finish is not None else None
        except BaseException as exc:
            self._state, self._value = 2, exc
            self._release()
            raise
        self._state, self._value = 1, value
        self._release()

    def _release(self):
        ctx, hid = self._ctx, self._id
        self._keep = None
        self._finish = None
        if hid and ctx.alive:
            try:
                _native.cfx_handle_release(ctx.ptr, hid)
            except (ConfluxError, ValueError):
                pass
        self._id = 0

    def __del__(self):
        try:
            if self._id == 0 or not self._ctx.alive:
                return
            if self._state == 0 and not _capi.cfx_poll(self._ctx.ptr, self._id):
                # Still running: the engine borrows our buffers; park them until it completes.
                _orphans.append((self._ctx, self._id, self._keep))
                return
            _capi.cfx_handle_release(self._ctx.ptr, self._id)
        except Exception:
            pass


data_address = _native.cfx_py_data_address


def fast_context():
    """current() for the fast path of lone collectives (conflux._ops): the live context, after
    the handles parked while pending were reaped."""
    ctx = _ctx
    if ctx is None or ctx.ptr is None:
        raise NotInitializedError("Conflux has not been initialized; use conflux.init().")
    if _orphans:
        _reap_orphans()
    return ctx


_NO_CONTEXT = _Context(None)


def native_context():
    """fast_context() for native code (conflux._ops' _NATIVE): without a live context it returns
    one whose address is 0, which the native call declines, so that the Python path reports bad
    arguments before the missing init(), as everywhere."""
    ctx = _ctx
    if ctx is None or ctx.ptr is None:
        return _NO_CONTEXT
    if _orphans:
        _reap_orphans()
    return ctx


def _park(ctx, hid, keep):
    """Takes a blocking call's handle left pending (a signal interrupted its wait) with what the
    engine still borrows, as a Handle dropped while pending is."""
    _orphans.append((ctx, hid, keep))


_native.cfx_py_fast_init(_park, check_compression)


def submit(fn, args, keep, finish, op, name=None):
    """Calls fn(ctx, *args) -> cfx_handle and wraps it. Argument errors raise here, at the call."""
    ctx = current()
    _reap_orphans()
    hid = fn(ctx.ptr, *args)
    return Handle(ctx, hid, keep, finish, op, name)


def poll(handle):
    """True when `handle` completed."""
    if not isinstance(handle, Handle):
        raise TypeError("expected a conflux handle, not %s" % type(handle).__name__)
    return handle.poll()


def synchronize(handle, timeout=None):
    """Waits for `handle` and returns the collective's result (or raises its error)."""
    if not isinstance(handle, Handle):
        raise TypeError("expected a conflux handle, not %s" % type(handle).__name__)
    return handle.wait(timeout)


def raise_status(status, message):
    """Raises the exception class of a cfx_status with `message`."""
    _capi.cfx_py_raise_status(int(status), message)


# ---- ABI dtype codes ----
UINT8 = _capi.CFX_UINT8
INT8 = _capi.CFX_INT8
UINT16 = _capi.CFX_UINT16
INT16 = _capi.CFX_INT16
INT32 = _capi.CFX_INT32
INT64 = _capi.CFX_INT64
FLOAT16 = _capi.CFX_FLOAT16
BFLOAT16 = _capi.CFX_BFLOAT16
FLOAT32 = _capi.CFX_FLOAT32
FLOAT64 = _capi.CFX_FLOAT64
BOOL = _capi.CFX_BOOL


def dtype_size(code):
    return _capi.cfx_dtype_size(code)


def dtype_name(code):
    return _capi.cfx_dtype_name(code)


def barrier_async():
    return submit(_capi.cfx_barrier_async, (), None, None, "barrier")


def barrier():
    """A blocking barrier in one call into C (cfx_py_run)."""
    _native.cfx_py_run(_native.CFX_PY_BARRIER, None, None, None, 0, 0.0, 0.0, 0, fast_context(),
                       None)


def join_async():
    return submit(_capi.cfx_join_async, (), None, lambda h: h.join_rank(), "join")


# ---- shared tensor memory ----
_SIZE_MAX = (1 << 64) - 1


class _SharedBlock:
    """One cfx_alloc block as numpy sees it (bytes, through __array_interface__). The array made
    from it has it as its base, every numpy view of that array and every torch tensor made from it
    (torch.from_numpy) holds that array, and a handle holds the arrays/tensors of its collective
    until it completes; so the block lives while anything can still reach its memory. It goes with
    `_owner`, whose destructor calls cfx_free once (in C: it needs no module state, which may be
    gone when the last arrays are collected at interpreter exit)."""

    __slots__ = ("_owner", "__array_interface__", "__weakref__")

    def __init__(self, nbytes):
        if nbytes > _SIZE_MAX:  # beyond size_t: SWIG would say only OverflowError
            raise OutOfMemoryError("cfx_alloc: %d bytes is more than any pool" % nbytes)
        address, self._owner = _capi.cfx_py_alloc(nbytes)
        self.__array_interface__ = {"data": (address, False), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}


def shared_bytes(nbytes):
    """A new 1-D uint8 array of `nbytes` bytes of shared tensor memory (contents undefined);
    OutOfMemoryError/ConfigError with the library's message when the pool refuses."""
    return _np.asarray(_SharedBlock(nbytes))
