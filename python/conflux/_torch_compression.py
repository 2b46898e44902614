"""conflux.torch's compressors (Horovod's Compression.none / Compression.fp16 and the Compressor
interface) and what one given for an allreduce becomes: the engine's wire compression where the
engine compresses the tensor, else the compressor's own cast around the allreduce.
"""
import torch

from . import _args
from ._core import Adasum
from ._torch_adapter import _strided


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
    """Sends floating-point tensors as float16 (halves the bytes on the wire)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.type(ctx)


class Compression:
    """Horovod's compressors. Passed to this module's allreduce or DistributedOptimizer, they
    name the engine's wire compression (none: conflux.Compression.none, fp16:
    conflux.Compression.fp16): no cast in Python, the engine rounds where it sends 16-bit values
    and combines in float32. compress()/decompress() are what Horovod's cast does."""
    none = NoneCompressor
    fp16 = FP16Compressor


_args.COMPRESSION_ALIASES[NoneCompressor] = _args.Compression.none
_args.COMPRESSION_ALIASES[FP16Compressor] = _args.Compression.fp16
_WIRE_DTYPES = (torch.float32, torch.float64)


def _compressible(tensor):
    """Whether the engine compresses an allreduce of `tensor` (under an op other than Adasum):
    dense float32/float64 CPU tensors."""
    return tensor.dtype in _WIRE_DTYPES and tensor.is_cpu and tensor.layout == _strided


def _wire_compression(compressor, tensor, op):
    """What a Horovod compressor given for `tensor`'s allreduce with `op` becomes: the engine's
    fp16 compression for Compression.fp16 (that class, not a subclass of one's own) where the
    engine compresses, else 0: the compressor's compress()/decompress() apply (its cast for
    float16, bfloat16 and CUDA tensors and under Adasum, nothing for integers)."""
    if compressor is FP16Compressor and op != Adasum and _compressible(tensor):
        return _args.Compression.fp16
    return 0

# Users import these from conflux.torch, which re-exports them: reprs (the optimizers' signatures
# show NoneCompressor as a default), pickles and help() name that module.
for _public in (Compressor, NoneCompressor, FP16Compressor, Compression):
    _public.__module__ = "conflux.torch"
