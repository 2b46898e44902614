"""Horovod's TF compressors (Compression.none, Compression.fp16, the Compressor interface) and what
one given to an allreduce becomes: for float32/float64 tensors, the engine's wire compression
(Compression.fp16 -> conflux.Compression.fp16: no cast in TF, the engine rounds where it sends
16-bit values and combines in float32); for other tensors, or a Compressor of the user's own, its
compress()/decompress() cast around the allreduce, as Horovod does. conflux.Compression values and
their names ("fp16", "bf16_everywhere", ...) are accepted too.
"""
import tensorflow as tf

from conflux import _args


class Compressor:
    """Interface for compressing and decompressing a tensor around the allreduce."""

    @staticmethod
    def compress(tensor):
        """Returns (compressed tensor, context for decompress)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """Horovod's compressors: none, fp16."""
    none = NoneCompressor
    fp16 = FP16Compressor


_WIRE = {NoneCompressor: _args.Compression.none, FP16Compressor: _args.Compression.fp16}
_WIRE_DTYPES = (tf.float32, tf.float64)


def plan(compression, dtype):
    """(wire code, compressor or None) for an allreduce of `dtype`."""
    if compression is None:
        return 0, None
    if isinstance(compression, type) and issubclass(compression, Compressor) or \
            isinstance(compression, Compressor):
        cls = compression if isinstance(compression, type) else type(compression)
        if cls in _WIRE:
            code = int(_WIRE[cls])
            if code == 0:
                return 0, None
            return (code, None) if dtype in _WIRE_DTYPES else (0, compression)
        return 0, compression
    code = _args.check_compression(compression)
    if code != 0 and dtype not in _WIRE_DTYPES:
        return 0, None  # the engine compresses float32/float64 only; others travel as they are
    return code, None
