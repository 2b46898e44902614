"""The arguments every form of conflux.torch's DistributedOptimizer takes, checked alike (the
gradient-set optimizer, Adasum's, and conflux.horovod.torch's): named_parameters,
backward_passes_per_step, and compression, split into the engine's wire compression and the
compressor that casts where the engine does not compress.
"""
from . import _args
from ._torch_compression import FP16Compressor, NoneCompressor


def _compression_plan(compression):
    """(wire, compressor) for an optimizer's `compression`: `wire` is the cfx_compression it names
    (Compression.none and Compression.fp16 of conflux.torch: none and fp16; a conflux.Compression
    value or the engine's int: itself), None for a compressor of one's own; `compressor` is what
    applies where the engine does not compress (Compression.fp16: Horovod's cast to float16; a
    conflux.Compression value: nothing; one's own: itself, everywhere)."""
    try:
        wire = _args.check_compression(compression)
    except TypeError:
        if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
            raise TypeError("compression must be a conflux.Compression, Compression.none, "
                            "Compression.fp16 or a Compressor (compress() and decompress()), "
                            "not %r" % (compression,)) from None
        return None, compression
    try:
        wire = _args.Compression(wire)
    except ValueError:
        raise ValueError("compression %r is not a conflux.Compression (none, fp16, bf16, "
                         "fp16_everywhere, bf16_everywhere)" % (compression,)) from None
    return wire, (FP16Compressor if compression is FP16Compressor else NoneCompressor)


def _checked_passes(passes):
    """backward_passes_per_step as an int >= 1."""
    passes = int(passes)
    if passes < 1:
        raise ValueError("backward_passes_per_step must be at least 1, not %d" % passes)
    return passes


def _checked_names(optimizer, named_parameters):
    """named_parameters as a list of (name, parameter), checked as Horovod checks them."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [("allreduce.noname.%s.%s" % (g, i), v)
                            for g, group in enumerate(optimizer.param_groups)
                            for i, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = [k for k, _ in named_parameters]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         "%s" % ", ".join(dups))
    all_ids = {id(v) for group in optimizer.param_groups for v in group["params"]}
    unnamed = all_ids - {id(v) for _, v in named_parameters}
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were "
                         "not named. Python object ids: %s" % ", ".join(str(i) for i in unnamed))
    return named_parameters

