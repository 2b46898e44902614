"""Gradient sets: register a model's gradients once, then per step only mark them ready and wait.

    gs = conflux.GradientSet("model")            # owned storage, Average over ranks
    iw = gs.add("fc.weight", (256, 128), numpy.float32)
    ib = gs.add("fc.bias", 128)
    gs.commit()                                  # collective: same names, dtypes, shapes on every rank
    w = gs.array(iw)                             # the gradient's buffer (shared tensor memory)
    for step in ...:
        w[...] = ...; gs.ready(iw)               # any order, any thread
        gs.ready("fc.bias")
        gs.wait()                                # the averages are now in place in w, ...

Owned sets (the default) keep every gradient in Conflux's storage, so every step takes the direct
path without copies; `array()` gives a NumPy view of it after commit(). Borrowed sets (owned=False)
register the caller's own C-contiguous arrays (`add(name, array=a)`), kept alive by the set.
A set's storage lives while the set or any array from `array()` is referenced; free() (or leaving a
`with` block) releases the set on this rank, every rank must do it.
"""
import math as _math
import operator as _operator

import numpy as _np

from . import _args
from . import _capi
from . import _core
from ._numpy import _describe, _dtype_code, _inplace


class _Native:
    """The cfx_gradset itself; freed when the GradientSet and every array from it are gone."""

    __slots__ = ("ptr", "ctx", "__weakref__")

    def __init__(self, ptr, ctx):
        self.ptr = ptr
        self.ctx = ctx

    def release(self):
        ptr, self.ptr = self.ptr, None
        if ptr is not None and self.ctx.alive:
            _capi.cfx_gradset_free(ptr)

    def __del__(self):
        self.release()


class _View:
    """One owned gradient's memory as numpy sees it; holds the set's storage alive."""

    __slots__ = ("_native", "__array_interface__")

    def __init__(self, native, address, dtype, shape):
        self._native = native
        self.__array_interface__ = {"data": (address, False), "shape": tuple(shape),
                                    "typestr": dtype.str, "version": 3}


class GradientSet:
    """A set of gradients reduced together every step (cfx_gradset). Options: op (Average, Sum,
    Min, Max, Product, Adasum), bucket_bytes (0: chosen by Conflux), accumulate_steps (local
    passes summed by the caller before one reduction; ready() once per pass), prescale,
    postscale, owned, compression (a conflux.Compression: the set then holds float32 and float64
    gradients only) and error_feedback (with compression: each rank keeps what the rounding took
    from the values it packed and adds it to the next step's)."""

    def __init__(self, name, op=_core.Average, bucket_bytes=0, accumulate_steps=1, prescale=1.0,
                 postscale=1.0, owned=True, compression=_args.Compression.none,
                 error_feedback=False):
        name = _args.check_name(name)
        if name is None:
            raise TypeError("a gradient set needs a name (the same on every rank)")
        opts = _capi.cfx_gradset_options()
        _capi.cfx_gradset_options_init(opts, _capi.CFX_GRADSET_OPTIONS_VERSION)
        opts.op = _args.check_op(op)
        opts.bucket_bytes = _operator.index(bucket_bytes)
        opts.accumulate_steps = _operator.index(accumulate_steps)
        opts.prescale = _args.check_scale(prescale, "prescale")
        opts.postscale = _args.check_scale(postscale, "postscale")
        opts.owned = 1 if owned else 0
        opts.compression = _args.check_compression(compression)
        opts.error_feedback = _operator.index(error_feedback)  # the engine takes 0 and 1
        ctx = _core.current()
        self.name = name
        self.owned = bool(owned)
        self._native = _Native(_capi.cfx_gradset_create(ctx.ptr, name, opts), ctx)
        self._index = {}       # gradient name -> index
        self._grads = []       # per index: (name, numpy dtype, shape, borrowed array or None)
        self._arrays = {}      # index -> the array handed out (owned sets)
        self._committed = False

    # ---- registration ----
    def add(self, name, shape=None, dtype=_np.float32, array=None):
        """Registers one gradient and returns its index (this rank's order of adds). Owned sets:
        `shape` and `dtype`, the array comes from array() after commit(). Borrowed sets: `array`,
        a C-contiguous writeable numpy array that holds the gradient every step (or any CPU DLPack
        object, held as a numpy view of its memory)."""
        native = self._live()
        if self._committed:
            raise _core.InvalidArgumentError("gradient set '%s' is committed; add() comes before "
                                             "commit()" % self.name)
        gname = _args.check_name(name)
        if gname is None:
            raise TypeError("a gradient needs a name")
        if self.owned:
            if array is not None:
                raise ValueError("gradient set '%s' owns its storage: add('%s') takes shape and "
                                 "dtype, not an array (or create the set with owned=False)"
                                 % (self.name, gname))
            if shape is None:
                raise TypeError("add('%s') needs a shape" % gname)
            dtype = _np.dtype(dtype)
            code = _dtype_code(dtype)
            shape = _args.check_shape(shape)
            desc = (None, code, shape)
        else:
            if array is None:
                raise ValueError("gradient set '%s' is borrowed (owned=False): add('%s') needs "
                                 "array=" % (self.name, gname))
            array = _inplace(array, "gradient '%s'" % gname)   # a DLPack object: an ndarray view
            dtype, shape = array.dtype, array.shape
            desc = _describe(array, "gradient '%s'" % gname)
        index = _capi.cfx_gradset_add(native.ptr, gname, desc)
        self._index[gname] = index
        while len(self._grads) <= index:
            self._grads.append(None)
        self._grads[index] = (gname, dtype, shape, array)
        return index

    def commit(self):
        """Collective: checks every rank's registration (MismatchError naming the gradient) and
        plans the buckets; owned storage starts zeroed."""
        native = self._live()
        _capi.cfx_gradset_commit(native.ptr)
        self._committed = True

    # ---- per step ----
    def index(self, i_or_name):
        """The index of a gradient given by index or by name."""
        if isinstance(i_or_name, str):
            try:
                return self._index[i_or_name]
            except KeyError:
                raise KeyError("gradient set '%s' has no gradient '%s'"
                               % (self.name, i_or_name)) from None
        i = _operator.index(i_or_name)
        if not 0 <= i < len(self._grads):
            raise IndexError("gradient set '%s' has %d gradients; index %d is out of range"
                             % (self.name, len(self._grads), i))
        return i

    def array(self, i_or_name):
        """The gradient's array: owned sets, a view of Conflux's storage (after commit()); borrowed
        sets, the caller's array."""
        native = self._live()
        i = self.index(i_or_name)
        gname, dtype, shape, borrowed = self._grads[i]
        if borrowed is not None:
            return borrowed
        if not self._committed:
            raise _core.InvalidArgumentError("gradient set '%s' is not committed; its storage "
                                             "exists after commit()" % self.name)
        a = self._arrays.get(i)
        if a is None:
            if _math.prod(shape) == 0:
                a = _np.empty(shape, dtype)
            else:
                address = _capi.cfx_gradset_data(native.ptr, i)
                a = _np.asarray(_View(native, address, dtype, shape))
            self._arrays[i] = a
        return a

    def arrays(self):
        """Every gradient's array, in index order."""
        return [self.array(i) for i in range(len(self._grads))]

    def ready(self, i_or_name):
        """The gradient was produced for this pass (any order, any thread)."""
        native = self._live()
        _capi.cfx_gradset_ready(native.ptr, self.index(i_or_name))

    def wait(self, timeout=None):
        """Ends the step: unmarked gradients are reduced as they are; returns once every result is
        in place. WaitTimeoutError after `timeout` seconds (the step stays pending; call again)."""
        native = self._live()
        _capi.cfx_py_gradset_wait(native.ptr, -1.0 if timeout is None else float(timeout))

    # ---- lifetime ----
    def free(self):
        """Releases the set on this rank (every rank must); idempotent. Owned storage goes once
        every array from array() has been collected as well."""
        self._native = None  # the native set goes with its last reference (this, or an array's)
        self._arrays = {}
        self._grads = [(g[0], g[1], g[2], None) if g else g for g in self._grads]

    close = free

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __len__(self):
        return len(self._grads)

    def __repr__(self):
        state = "freed" if self._native is None else ("committed" if self._committed else "open")
        return "<conflux.GradientSet '%s' %d gradients, %s>" % (self.name, len(self._grads), state)

    def _live(self):
        native = self._native
        if native is None or native.ptr is None:
            raise _core.InvalidArgumentError("gradient set '%s' was freed" % self.name)
        if not native.ctx.alive:
            raise _core.NotInitializedError("gradient set '%s': Conflux was shut down" % self.name)
        return native
