"""What a conflux.jax collective hands to its primitive (conflux._jax_primitive): the argument
checked (a dtype the engine reduces, a CPU array; errors name the op and the array), its abstract
value, the name and label attributes, the input/output aliases that put results in the inputs'
buffers, and the vmap rule of the elementwise collectives.
"""
import numpy as _np

import jax
import jax.numpy as jnp
from jax.core import ShapedArray

from . import _args
from . import _jax_primitive as _jax_ffi
from ._core import DtypeError

# The dtypes the engine reduces (cfx_dtype); anything else is a DtypeError at the call.
_DTYPES = frozenset(_np.dtype(d) for d in (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "int64", "float16", "float32",
    "float64")) | {_np.dtype(jnp.bfloat16)}


# ---- argument checks ----
def _is_tracer(x):
    return isinstance(x, jax.core.Tracer)


def _label(x, name):
    if name:
        return repr(name)
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    return "an array of shape %s and dtype %s" % (tuple(shape) if shape is not None else "?",
                                                   dtype)


def _check(x, op, name):
    """`x` as a JAX value after checking what the CPU path needs; errors name the op and array."""
    if not _is_tracer(x) and not isinstance(x, jax.Array):
        x = jnp.asarray(x)
    dtype = _np.dtype(x.dtype)
    if dtype not in _DTYPES:
        raise DtypeError("conflux.jax.%s of %s: dtype %s is not one Conflux supports (bool, int8, "
                         "uint8, int16, uint16, int32, int64, float16, bfloat16, float32, float64)"
                         % (op, _label(x, name), dtype))
    if not _is_tracer(x):
        platforms = {d.platform for d in x.devices()}
        if platforms != {"cpu"}:
            raise ValueError("conflux.jax.%s of %s: the array is on %s; conflux.jax takes CPU "
                             "arrays (jax.device_put(x, jax.devices('cpu')[0]))"
                             % (op, _label(x, name), ", ".join(sorted(platforms))))
    return x


def _aval(x):
    return ShapedArray(tuple(x.shape), x.dtype)


def _name_attrs(name, label):
    return (("name", _args.check_name(name) or ""), ("label", label))


# ---- vmap rules: elementwise across ranks, so the batch dimension stays where it is ----
def _elementwise_batch(args, dims, *, target, attrs, aliases):
    n = _batch_size(args, dims)
    args = [jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (n,) + a.shape)
            for a, d in zip(args, dims)]
    outs = _jax_ffi.bind(target, args, [_aval(a) for a in args], attrs, _elementwise_batch,
                         aliases)
    return outs, [0] * len(outs)


def _batch_size(args, dims):
    for a, d in zip(args, dims):
        if d is not None:
            return a.shape[d]
    return 1


def _in_place(n):
    """Results in their inputs' buffers (XLA's input_output_aliases): inside jit a gradient is an
    intermediate whose buffer XLA hands over, so the engine reduces it in place instead of
    writing a fresh output that the kernel must first fault in page by page (ResNet-50's 102 MB
    tree: bench/jax_allreduce.py). Where the input lives on (a jit argument not donated), XLA
    copies it first. Eager calls drop the aliases (conflux/_jax_primitive.py)."""
    return tuple((i, i) for i in range(n))
