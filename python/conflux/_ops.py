"""The collectives of `conflux` (NumPy) and `conflux.torch`, made from one table.

OPS names every collective once: the ABI entry point it calls, the parameters it takes after its
input, whether its input is one tensor or a group of them, whether it also works in place, and how
its out-of-place result is made. Each one exists as four functions (two when it has no in-place
form): `name(...)` blocks and returns the result, `name_async(...)` returns a Handle whose wait()
returns it, and `name_` / `name_async_` work in place and return the input itself.

The functions themselves are ordinary code in conflux._collectives, which tools/gen-python-collectives
writes from this table (and python/tests/unit/test_generated.py checks it is up to date): one
factory, one body per function, which install() calls with an array library's Adapter (how it
checks, describes, allocates and copies a tensor); the docstrings are the library's. The input
parameter is `tensor` (`tensors` for the grouped ones) in every library, as in Horovod.
"""
from typing import Callable, NamedTuple

from . import _args
from . import _capi
from . import _collectives
from . import _core

# ---- how the out-of-place result is made ----
LIKE = "like"      # the input's shape and dtype: the binding allocates it, the ABI writes it
COPY = "copy"      # the input's shape: a copy of the input, then the in-place collective on it
ROWS = "rows"      # along dim 0, known after negotiation: the engine allocates it, the binding
#                    copies it into a new tensor (a lone input needs a dim 0)
SPLITS = "rows+splits"  # ROWS, returned with the rows every rank sent this one


class Op(NamedTuple):
    name: str        # "allreduce": also the label of its handles and of its error messages
    entry: str       # the cfx_* function of conflux._capi
    params: tuple    # the parameters after the input, in signature order (keys of PARAMS)
    grouped: bool    # a list of inputs, negotiated and completed together
    inplace: bool    # has the in-place forms
    result: str      # LIKE, COPY, ROWS or SPLITS


REQUIRED = object()

# parameter: (default, how the ABI gets it: formatted with the parameter's name); `name` is
# always the ABI's first argument, before the tensor description.
PARAMS = {
    "name": (None, None),
    "op": (_core.Average, "check_op({0})"),
    "root_rank": (REQUIRED, "check_root({0})"),
    "splits": (None, "check_splits({0})"),
    "prescale_factor": (1.0, 'check_scale({0}, "{0}")'),
    "postscale_factor": (1.0, 'check_scale({0}, "{0}")'),
    "compression": (_args.Compression.none, "check_compression({0})"),
}
_REDUCE = ("op", "name", "prescale_factor", "postscale_factor")
# Only the lone allreduce has per-call options in the ABI (cfx_allreduce_async_opts).
_ALLREDUCE = _REDUCE + ("compression",)
_NAME = ("name",)
_ROOT = ("root_rank", "name")
_SPLITS = ("splits", "name")

# Every op has a blocking and an async form (forms()).
OPS = (
    #  name                    ABI entry (cfx_py_*: the binding's)  params      grouped inplace result
    Op("allreduce",             "cfx_py_allreduce_async",            _ALLREDUCE, False,  True,   LIKE),
    Op("grouped_allreduce",     "cfx_grouped_allreduce_async",       _REDUCE,    True,   True,   LIKE),
    Op("allgather",             "cfx_allgather_async",               _NAME,      False,  False,  ROWS),
    Op("grouped_allgather",     "cfx_grouped_allgather_async",       _NAME,      True,   False,  ROWS),
    Op("broadcast",             "cfx_broadcast_async",               _ROOT,      False,  True,   COPY),
    Op("alltoall",              "cfx_alltoall_async",                _SPLITS,    False,  False,  SPLITS),
    Op("reducescatter",         "cfx_reducescatter_async",           _REDUCE,    False,  False,  ROWS),
    Op("grouped_reducescatter", "cfx_grouped_reducescatter_async",   _REDUCE,    True,   False,  ROWS),
)


def forms(op):
    """The public names of op's functions."""
    if op.inplace:
        return (op.name, op.name + "_", op.name + "_async", op.name + "_async_")
    return (op.name, op.name + "_async")


NAMES = tuple(name for op in OPS for name in forms(op))


class Adapter(NamedTuple):
    """What an array library supplies. `what` is the op's name, for error messages."""
    inplace: Callable      # (x, what) -> x, or a view of its memory, checked for writing in place
    input: Callable        # (x, what) -> a contiguous tensor of x's values (x itself if it is)
    copy: Callable         # (x, what) -> a new contiguous tensor of x's values
    describe: Callable     # (t) -> the ABI's tuple (address, dtype, shape[, device, stream])
    output_like: Callable  # (t) -> (a new tensor for t's LIKE result, the address of its memory)
    ndim: Callable         # (t) -> t's number of dimensions
    output: Callable       # (handle, index, t) -> output `index` of a completed handle, as a new
    #                        tensor (t: the input it belongs to)
    as_splits: Callable    # (list of ints) -> received splits, as the library returns them
    autograd: dict         # op name -> the autograd Function its blocking out-of-place form
    #                        applies when differentiable(x, what) says x needs a gradient
    differentiable: Callable
    native: Callable = None  # the lone allreduce in native code (conflux._torch_native.allreduce):
    #                        (form, name, x, op, prescale, postscale, compression, ctx address) ->
    #                        the result, or None to take the Python path


# The lone collectives with a fast path on the job's context (cfx_py_run / cfx_py_submit: one call
# into C that submits and, blocking, waits and releases the handle), by their kind there.
FAST_KIND = {"allreduce": _capi._capi_native.CFX_PY_ALLREDUCE,
             "broadcast": _capi._capi_native.CFX_PY_BROADCAST}


def install(module_globals, adapter, docs, submit=_core.submit):
    """Defines the functions of every op of OPS (conflux._collectives, generated from this table)
    in the module whose globals are `module_globals`, with docstrings from `docs`: a docstring as
    it reads without the indentation of a def's body. `submit` (as _core.submit) starts a
    collective: the process sets' functions pass one that submits to their own context."""
    module = module_globals["__name__"]
    made = _collectives.collectives(adapter, submit)
    for name, fn in made.items():
        fn.__module__, fn.__qualname__ = module, name
        doc = docs.get(name)
        fn.__doc__ = None if doc is None else doc.replace("\n", "\n    ")
        module_globals[name] = fn
