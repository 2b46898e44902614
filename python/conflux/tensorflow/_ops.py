"""conflux.tensorflow's link to TensorFlow: loads conflux/_tf_ops.tf<version>.so
(bindings/tensorflow/tf_ops.cpp, built by python/tensorflow.cmake when tensorflow imports in the
build's Python; the one for the installed tensorflow, whose version is in the name, and an
ImportError naming both versions when only another one's exists) with tf.load_op_library (the
ops) and ctypes (cfx_tf_set_context, cfx_tf_quiesce); wraps each op with the engine name it takes and
registers the gradients.

Names: a user's `name` is the engine's name. Without one, eagerly the op runs unnamed (the engine
names it by submission order, which eager execution keeps the same on every rank); while tracing
(tf.function, Keras's train step) the name comes from the graph, "<op>.<input tensor's name>" made
unique in the graph, because the graph executor may start independent ops in any order.

`UNAVAILABLE` is None when everything loaded, else the reason conflux.tensorflow cannot run.
"""
import ctypes
import os
import re

import tensorflow as tf

from conflux import _args
from conflux import _core

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

UNAVAILABLE = None
MPI_LIB = None   # the op module (Horovod's name for it)
_lib = None


def _load():
    global UNAVAILABLE, MPI_LIB, _lib
    path = os.path.join(_PKG, "_tf_ops.tf%s.so" % tf.__version__)
    if not os.path.exists(path):
        built = sorted(f[len("_tf_ops.tf"):-len(".so")] for f in os.listdir(_PKG)
                       if f.startswith("_tf_ops.tf") and f.endswith(".so"))
        if built:
            raise ImportError("conflux's TF op library was built against tensorflow %s but "
                              "tensorflow %s is installed; rebuild Conflux against this tensorflow "
                              "(or install tensorflow %s)" % (", ".join(built), tf.__version__,
                                                              built[-1]))
        UNAVAILABLE = ("conflux/_tf_ops.tf<version>.so was not built (python/tensorflow.cmake "
                       "builds it when tensorflow imports in the build's Python; see the CMake "
                       "output for the reason)")
        return
    try:
        # load_op_library first: it registers the ops it sees being registered during the dlopen.
        MPI_LIB = tf.load_op_library(path)
        _lib = ctypes.CDLL(path)
    except (OSError, tf.errors.NotFoundError) as e:
        UNAVAILABLE = "%s does not load: %s" % (os.path.basename(path), e)
        MPI_LIB = None
        return
    _lib.cfx_tf_set_context.argtypes = [ctypes.c_void_p]
    _lib.cfx_tf_set_context.restype = None
    _lib.cfx_tf_quiesce.argtypes = [ctypes.c_double]
    _lib.cfx_tf_quiesce.restype = ctypes.c_int
    _lib.cfx_tf_set_process_set.argtypes = [ctypes.c_int64, ctypes.c_void_p]
    _lib.cfx_tf_set_process_set.restype = None


_load()


def require():
    if UNAVAILABLE is not None:
        raise RuntimeError("conflux.tensorflow is unavailable: " + UNAVAILABLE)


def set_context(address):
    """Points the kernels at a cfx_context (its address as an int; 0 clears it)."""
    if _lib is not None:
        _lib.cfx_tf_set_context(ctypes.c_void_p(address or None))


def set_process_set(set_id, address):
    """Points the ops of process set `set_id` at its subset context (address 0 forgets it)."""
    if _lib is not None:
        _lib.cfx_tf_set_process_set(int(set_id), ctypes.c_void_p(address or None))


def quiesce(timeout_s=30.0):
    """Before the context is freed: shuts it down and waits for every kernel in flight."""
    if _lib is not None:
        _lib.cfx_tf_quiesce(float(timeout_s))


# ---- names ----
def _normalize(name):
    return re.sub(r"[^a-zA-Z0-9_.\-/]", "_", name)


def engine_name(kind, name, tensor=None, label=None):
    """The `tensor_name` attr: the user's name, "" eagerly, else one unique in the graph made
    from `label` or the input tensor's name."""
    if name is not None:
        return str(name)
    if tf.executing_eagerly():
        return ""
    base = kind
    tname = label or getattr(tensor, "name", None)
    if tname:
        base = "%s.%s" % (kind, _normalize(tname).replace(":", "_"))
    return tf.compat.v1.get_default_graph().unique_name("cfx." + base, mark_as_used=True)


# ---- the raw ops ----
def allreduce(tensor, op, prescale=1.0, postscale=1.0, compression=0, name=None, ps=0):
    return MPI_LIB.cfx_allreduce(tensor, reduce_op=int(op), prescale_factor=float(prescale),
                                 postscale_factor=float(postscale), compression=int(compression),
                                 tensor_name=engine_name("allreduce", name, tensor),
                                 process_set_id=ps)


def grouped_allreduce(tensors, op, prescale=1.0, postscale=1.0, compression=0, name=None, ps=0):
    if not tensors:
        return []
    return MPI_LIB.cfx_grouped_allreduce(
        list(tensors), reduce_op=int(op), prescale_factor=float(prescale),
        postscale_factor=float(postscale), compression=int(compression),
        tensor_name=engine_name("grouped_allreduce", name, tensors[0]), process_set_id=ps)


def allgather(tensor, name=None, ps=0):
    return MPI_LIB.cfx_allgather(tensor, tensor_name=engine_name("allgather", name, tensor),
                                 process_set_id=ps)


def broadcast(tensor, root_rank, name=None, ps=0):
    """root_rank: the rank within the process set `ps` (the job's rank for the global set)."""
    return MPI_LIB.cfx_broadcast(tensor, root_rank=int(root_rank),
                                 tensor_name=engine_name("broadcast", name, tensor),
                                 process_set_id=ps)


def alltoall(tensor, splits, name=None, ps=0):
    if splits is None:
        splits = tf.zeros([0], tf.int64)
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int64)
    return MPI_LIB.cfx_alltoall(tensor, splits, tensor_name=engine_name("alltoall", name, tensor),
                                process_set_id=ps)


def reducescatter(tensor, op, prescale=1.0, postscale=1.0, name=None, ps=0):
    return MPI_LIB.cfx_reducescatter(tensor, reduce_op=int(op), prescale_factor=float(prescale),
                                     postscale_factor=float(postscale),
                                     tensor_name=engine_name("reducescatter", name, tensor),
                                     process_set_id=ps)


def join():
    return MPI_LIB.cfx_join()


def barrier(ps=0):
    return MPI_LIB.cfx_barrier(process_set_id=ps)


def rank_op():
    return MPI_LIB.cfx_rank()


def size_op():
    return MPI_LIB.cfx_size()


def local_rank_op():
    return MPI_LIB.cfx_local_rank()


def local_size_op():
    return MPI_LIB.cfx_local_size()


# ---- gradients ----
_SUM = _core.Sum
_AVERAGE = _core.Average


def _reduced_grad(op_name, grad, op, pre, post, compression=0, ps=0):
    if op not in (_SUM, _AVERAGE):
        raise NotImplementedError("conflux.tensorflow: the gradient of %s with op %s is not defined "
                                  "(only Sum and Average have one)" % (op_name, _args.OP_NAMES.get(op, op)))
    return allreduce(grad, op, pre, post, compression, ps=ps)


def _global_grad(op, what):
    """The gradients that need this rank's place among the ranks: the global set only."""
    if op.get_attr("process_set_id") != 0:
        raise NotImplementedError("conflux.tensorflow: the gradient of %s over a process set is "
                                  "not defined (the global set only)" % what)


if MPI_LIB is not None:
    @tf.RegisterGradient("CfxAllreduce")
    def _allreduce_grad(op, grad):
        return _reduced_grad("allreduce", grad, op.get_attr("reduce_op"),
                             op.get_attr("prescale_factor"), op.get_attr("postscale_factor"),
                             op.get_attr("compression"), op.get_attr("process_set_id"))

    @tf.RegisterGradient("CfxGroupedAllreduce")
    def _grouped_allreduce_grad(op, *grads):
        rop = op.get_attr("reduce_op")
        if rop not in (_SUM, _AVERAGE):
            raise NotImplementedError("conflux.tensorflow: the gradient of grouped_allreduce is "
                                      "defined for Sum and Average only")
        grads = [tf.zeros_like(x) if g is None else tf.convert_to_tensor(g)
                 for g, x in zip(grads, op.inputs)]
        return grouped_allreduce(grads, rop, op.get_attr("prescale_factor"),
                                 op.get_attr("postscale_factor"), op.get_attr("compression"),
                                 ps=op.get_attr("process_set_id"))

    @tf.RegisterGradient("CfxAllgather")
    def _allgather_grad(op, grad):
        # Every rank's gradient of the whole result, summed; this rank's rows of it.
        _global_grad(op, "allgather")
        grad = allreduce(grad, _SUM)
        d0 = tf.shape(op.inputs[0], out_type=tf.int64)[:1]
        sizes = allgather(d0)
        start = tf.reduce_sum(sizes[:rank_op()])
        return grad[start:start + d0[0]]

    @tf.RegisterGradient("CfxBroadcast")
    def _broadcast_grad(op, grad):
        _global_grad(op, "broadcast")
        reduced = allreduce(grad, _SUM)
        keep = tf.cast(tf.equal(rank_op(), op.get_attr("root_rank")), reduced.dtype)
        return reduced * keep

    @tf.RegisterGradient("CfxAlltoall")
    def _alltoall_grad(op, grad, _grad_splits):
        # What each rank received goes back where it came from.
        back, _ = alltoall(grad, tf.cast(op.outputs[1], tf.int64), ps=op.get_attr("process_set_id"))
        return back, None

    @tf.RegisterGradient("CfxReducescatter")
    def _reducescatter_grad(op, grad):
        _global_grad(op, "reducescatter")
        rop = op.get_attr("reduce_op")
        if rop not in (_SUM, _AVERAGE):
            raise NotImplementedError("conflux.tensorflow: the gradient of reducescatter is "
                                      "defined for Sum and Average only")
        scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
        g = allgather(grad)
        if rop == _AVERAGE:
            g = g / tf.cast(size_op(), g.dtype)
        return g * tf.cast(scale, g.dtype) if scale != 1.0 else g

    for _name in ("CfxJoin", "CfxBarrier", "CfxRank", "CfxSize", "CfxLocalRank", "CfxLocalSize"):
        tf.no_gradient(_name)
