"""horovod.torch.compression: the gradient compressors (conflux.torch's)."""
from conflux.torch import Compression, Compressor, FP16Compressor, NoneCompressor  # noqa: F401
