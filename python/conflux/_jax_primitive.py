"""conflux.jax's link to XLA: loads conflux/_jax_ffi.so (bindings/jax/jax_ffi.cpp, built by
python/jax.cmake when jaxlib is in the environment) with ctypes, registers its handlers with
jax.ffi for the CPU platform, and defines the one JAX primitive every collective of conflux.jax
binds: `conflux_collective`, carrying an ordered effect so that its calls run in program order
(inside jit, across jit calls and eagerly) and therefore in the same order on every rank, which is
what pairs the engine's unnamed collectives. Lowered to a typed-FFI custom call whose first operand
and first result are the effect's token.

`UNAVAILABLE` is None when everything loaded, else the reason conflux.jax cannot run.
"""
import ctypes
import os

import numpy as _np

import jax
from jax.interpreters import mlir

from . import _core
from jax._src import core as _jcore
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects

try:
    from jax.extend.core import Primitive
except ImportError:  # older jax
    from jax.core import Primitive

_HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier")

UNAVAILABLE = None
_lib = None
_path = os.path.join(_HERE, "_jax_ffi.so")
if not os.path.exists(_path):
    UNAVAILABLE = ("conflux/_jax_ffi.so was not built (python/jax.cmake builds it when jaxlib "
                   "imports in the build's Python; see the CMake output for the reason)")
else:
    try:
        _lib = ctypes.CDLL(_path)
    except OSError as e:
        UNAVAILABLE = "conflux/_jax_ffi.so does not load: %s" % e

if _lib is not None:
    _lib.cfx_jax_set_context.argtypes = [ctypes.c_void_p]
    _lib.cfx_jax_set_context.restype = None
    _lib.cfx_jax_set_subset.argtypes = [ctypes.c_int32, ctypes.c_void_p]
    _lib.cfx_jax_set_subset.restype = None
    for _t in TARGETS:
        jax.ffi.register_ffi_target("conflux_" + _t,
                                    jax.ffi.pycapsule(getattr(_lib, "cfx_jax_" + _t)),
                                    platform="cpu")


_pointed = [0]  # the address the handlers use now


def set_context(address):
    """Points the handlers at a cfx_context (its address as an int; 0 clears it). The library
    forgets every process set with the old context."""
    if _lib is not None:
        _lib.cfx_jax_set_context(ctypes.c_void_p(address or None))
        _pointed[0] = address or 0


def set_subset(number, address):
    """Maps process set `number` (> 0; the handlers' attribute "set") to its subset context's
    address, or forgets it (address 0)."""
    if _lib is not None:
        _lib.cfx_jax_set_subset(number, ctypes.c_void_p(address or None))


def follow_context():
    """Points the handlers at conflux's current context if they point elsewhere (a job joined
    with conflux.init() rather than conflux.jax.init(), or initialized again)."""
    ctx = _core._ctx
    address = ctx.address if ctx is not None and ctx.alive else 0
    if address != _pointed[0]:
        set_context(address)


# ---- the ordered effect ----
class ConfluxEffect(_effects.Effect):
    """Conflux's collectives, in program order (one ordered effect: one token chain)."""

    def __repr__(self):
        return "ConfluxEffect"

    __str__ = __repr__

    def __hash__(self):  # the same on every rank and run, as the effect's identity
        return hash("conflux.jax.ConfluxEffect")

    def __eq__(self, other):
        return isinstance(other, ConfluxEffect)


EFFECT = ConfluxEffect()
_effects.lowerable_effects.add_type(ConfluxEffect)
_effects.ordered_effects.add_type(ConfluxEffect)
_effects.control_flow_allowed_effects.add_type(ConfluxEffect)
_effects.custom_derivatives_allowed_effects.add_type(ConfluxEffect)
try:
    _effects.remat_allowed_effects.add_type(ConfluxEffect)
except AttributeError:
    pass

_abstract_token = getattr(_jcore, "abstract_token", None) or getattr(jax.ffi, "abstract_token")

# ---- the primitive ----
collective_p = Primitive("conflux_collective")
collective_p.multiple_results = True


def _impl(*args, **params):
    # Eagerly the inputs stay the caller's: an in-place result would cost XLA a copy of each
    # first, so the handler writes fresh outputs instead (inside jit the inputs are mostly
    # intermediates, e.g. gradients, whose buffers XLA hands over at no cost).
    params["aliases"] = ()
    return _dispatch.apply_primitive(collective_p, *args, **params)


def _abstract_eval(*avals, target, out_avals, attrs, batch_rule, aliases):
    del avals, target, attrs, batch_rule, aliases
    return list(out_avals), {EFFECT}


def _attr_value(v):
    if isinstance(v, bool):
        return _np.int32(v)
    if isinstance(v, int):
        return _np.int32(v)
    if isinstance(v, float):
        return _np.float64(v)
    return v


def _lowering(ctx, *args, target, out_avals, attrs, batch_rule, aliases):
    del out_avals, batch_rule
    token = ctx.tokens_in.get(EFFECT)
    ctx2 = ctx.replace(avals_in=(_abstract_token, *ctx.avals_in),
                       avals_out=(_abstract_token, *ctx.avals_out))
    # Operand and result 0 are the token: array i is operand and result i + 1.
    lowering_args = {"operand_output_aliases": {i + 1: o + 1 for i, o in aliases}} \
        if aliases else {}
    rule = jax.ffi.ffi_lowering("conflux_" + target, has_side_effect=True, **lowering_args)
    results = list(rule(ctx2, token, *args, **{k: _attr_value(v) for k, v in attrs}))
    ctx.set_tokens_out(mlir.TokenSet({EFFECT: results.pop(0)}))
    return results


def _no_gpu_lowering(ctx, *args, target, **params):
    raise NotImplementedError(
        "conflux.jax.%s: this build has no device path for JAX; put the arrays on the CPU "
        "(jax.device_put(x, jax.devices('cpu')[0])) or run JAX with JAX_PLATFORMS=cpu" % target)


def _batch(args, dims, *, target, out_avals, attrs, batch_rule, aliases):
    if batch_rule is None:
        raise NotImplementedError("conflux.jax.%s has no vmap rule (allreduce, grouped_allreduce "
                                  "and broadcast have one)" % target)
    return batch_rule(args, dims, target=target, attrs=attrs, aliases=aliases)


collective_p.def_impl(_impl)
collective_p.def_effectful_abstract_eval(_abstract_eval)
mlir.register_lowering(collective_p, _lowering, platform="cpu")
for _platform in ("cuda", "rocm"):
    try:
        mlir.register_lowering(collective_p, _no_gpu_lowering, platform=_platform)
    except (NotImplementedError, ValueError):
        pass

from jax.interpreters import batching as _batching  # noqa: E402
_batching.primitive_batchers[collective_p] = _batch


def bind(target, args, out_avals, attrs, batch_rule=None, aliases=()):
    """Runs collective `target` on the arrays `args`; `out_avals` are the results' ShapedArrays,
    `attrs` a tuple of (name, value) pairs of the handler's attributes, `aliases` (input index,
    output index) pairs whose output XLA places in the input's buffer (in place)."""
    follow_context()
    return collective_p.bind(*args, target=target, out_avals=tuple(out_avals),
                             attrs=tuple(attrs), batch_rule=batch_rule,
                             aliases=tuple(aliases))
