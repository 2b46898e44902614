"""The collectives' arguments, checked before anything reaches C: the reduction ops, wire
compression (and the aliases the framework layers add for it), and the checks every layer runs
on names, root ranks, scale factors, shapes and alltoall splits. Every binding layer (numpy,
torch, TensorFlow, JAX, the gradient sets) takes its arguments through these, so a bad one gets
the same error whichever framework passed it.
"""
import enum
import operator

from . import _capi

# ---- reduction ops ----
Sum = _capi.CFX_OP_SUM
Average = _capi.CFX_OP_AVERAGE
Min = _capi.CFX_OP_MIN
Max = _capi.CFX_OP_MAX
Product = _capi.CFX_OP_PRODUCT
Adasum = _capi.CFX_OP_ADASUM  # adaptive summation: float tensors on the CPU, allreduce only
# Each op's name, for messages (conflux.tensorflow's gradients name the op they refuse).
OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product",
            Adasum: "Adasum"}


def check_op(op):
    if isinstance(op, bool) or op not in OP_NAMES:
        raise ValueError("unknown reduction op %r; use Sum, Average, Min, Max, Product or Adasum" % (op,))
    return int(op)


# ---- wire compression ----
class Compression(enum.IntEnum):
    """How an allreduce's float32/float64 values travel (cfx_compression; docs/c-api.md
    "Compression"): `fp16` or `bf16` on the legs across hosts, `fp16_everywhere` or
    `bf16_everywhere` on every leg that goes over the transport (CFX_COMPRESSION_EVERYWHERE=1 makes
    fp16 and bf16 mean those). Each rank's values are rounded once when packed, combined in
    float32 and unpacked into the tensor's dtype; within a host the shared-memory reduction stays
    exact. The engine's ints are accepted wherever a Compression is."""
    none = _capi.CFX_COMPRESSION_NONE
    fp16 = _capi.CFX_COMPRESSION_FP16
    bf16 = _capi.CFX_COMPRESSION_BF16
    fp16_everywhere = _capi.CFX_COMPRESSION_FP16_EVERYWHERE
    bf16_everywhere = _capi.CFX_COMPRESSION_BF16_EVERYWHERE

    def __repr__(self):
        return "Compression." + self.name


Compression.__module__ = "conflux"

# Objects other than ints that name a compression: conflux.torch adds Horovod's compressor
# classes (Compression.none and Compression.fp16 there).
COMPRESSION_ALIASES = {}


def check_compression(compression):
    """The cfx_compression value of a compression argument: a Compression, the engine's int (an
    unknown one is the engine's to name), its name as a str ("none", "fp16", "bf16",
    "fp16_everywhere", "bf16_everywhere": the names every binding accepts), None (no compression)
    or an alias."""
    if isinstance(compression, int) and not isinstance(compression, bool):
        return int(compression)
    if compression is None:
        return 0
    if isinstance(compression, str):
        code = _capi.cfx_bind_compression_code(compression)
        if code < 0:
            raise ValueError("unknown compression %r; use one of: %s"
                             % (compression, ", ".join(_capi.cfx_py_compression_names())))
        return code
    try:
        code = COMPRESSION_ALIASES.get(compression)
    except TypeError:  # unhashable
        code = None
    if code is None:
        raise TypeError("compression must be a conflux.Compression or its name (%s), not %r"
                        % (", ".join(_capi.cfx_py_compression_names()), compression))
    return code


def check_name(name):
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError("name must be a str or None, not %s" % type(name).__name__)
    return name


def check_root(root_rank):
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        try:
            root_rank = int(root_rank.__index__())
        except AttributeError:
            raise TypeError("root_rank must be an int, not %s" % type(root_rank).__name__) from None
    return root_rank


def check_scale(factor, what):
    """A scale factor as a float; `what` names the parameter."""
    try:
        return float(factor)
    except (TypeError, ValueError):
        raise TypeError("%s must be a number" % what) from None


def check_shape(shape):
    """`shape` (an int, or a sequence of ints) as a tuple of ints >= 0."""
    try:
        shape = (operator.index(shape),)
    except TypeError:
        try:
            shape = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError("shape must be an int or a sequence of ints, not %r" % (shape,)) from None
    if any(d < 0 for d in shape):
        raise ValueError("negative dimensions are not allowed (shape %r)" % (shape,))
    return shape


_INT64_MAX = (1 << 63) - 1


def _dtype_is_integer(dtype):
    """Whether a numpy or torch dtype holds integers (bool is not a count)."""
    kind = getattr(dtype, "kind", None)              # numpy
    if kind is not None:
        return kind in "iu"
    is_floating, is_complex = getattr(dtype, "is_floating_point", None), getattr(dtype, "is_complex", None)
    if is_floating is not None:                      # torch
        return not is_floating and not is_complex and str(dtype) != "torch.bool"
    return False


def check_splits(splits):
    """None, or a sequence of ints each in 0 .. 2**63 - 1 (numpy/torch arrays of an integer dtype
    accepted). An array of another dtype is a ValueError naming its dtype, decided before any
    value is converted (so every rank refuses it alike, whatever its values are); a value out of
    range is a ValueError naming it, never the binding's OverflowError."""
    if splits is None:
        return None
    dtype = getattr(splits, "dtype", None)
    if dtype is not None:
        if not _dtype_is_integer(dtype):
            raise ValueError("splits must be of an integer dtype, not %s" % (dtype,))
        splits = splits.tolist()
    try:
        values = [operator.index(s) for s in splits]
    except TypeError:
        raise TypeError("splits must be None or a sequence of ints, not %r" % (splits,)) from None
    for i, v in enumerate(values):
        if not 0 <= v <= _INT64_MAX:
            raise ValueError("splits[%d] is %d; a split is a row count, 0 .. 2**63 - 1" % (i, v))
    return values
