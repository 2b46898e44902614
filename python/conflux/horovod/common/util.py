"""horovod.common.util: what this build of Conflux has, as Horovod's build queries report it, and
the small helpers Horovod scripts import from here.

mpi_built() and cuda_built() come from cfx_features(); nccl_built() is NCCL's version code
(major * 10000 + minor * 100 + patch, e.g. 22809 for 2.28.9; 0 without NCCL), read from the NCCL
library the engine is linked against. Gloo, DDL, oneCCL and ROCm are never built (Conflux's CPU
path is MPI and its GPU path CUDA + NCCL)."""
import ctypes
import functools

from conflux import _core


def _feature(name):
    return _core.features()[name]


@functools.lru_cache(maxsize=None)
def _nccl_version():
    """ncclGetVersion of the libnccl loaded with the engine (0 when there is none)."""
    path = None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libnccl.so" in line:
                    path = line.split(None, 5)[-1].strip()
                    break
    except OSError:
        pass
    if path is None:
        return 0
    version = ctypes.c_int(0)
    try:
        if ctypes.CDLL(path).ncclGetVersion(ctypes.byref(version)) != 0:
            return 0
    except (OSError, AttributeError):
        return 0
    return version.value


def mpi_built(verbose=False):
    """True: Conflux was built with its MPI transport."""
    return _feature("mpi")


def gloo_built(verbose=False):
    return False


def nccl_built(verbose=False):
    """NCCL's version code (an int, e.g. 22809) when Conflux was built with its NCCL data path,
    else 0."""
    return _nccl_version() if _feature("nccl") else 0


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def cuda_built(verbose=False):
    """True: Conflux was built with its CUDA kernels."""
    return _feature("cuda")


def rocm_built(verbose=False):
    return False


def gpu_available(ext_base_name, verbose=False):
    """True when a CUDA device is usable (ext_base_name, e.g. "torch", is accepted and ignored:
    Conflux has one library for every framework)."""
    return _feature("cuda_device")


def extension_available(ext_base_name, verbose=False):
    """True for "torch" (the only framework conflux.horovod binds)."""
    return ext_base_name in ("torch", "horovod.torch")


def is_iterable(x):
    try:
        iter(x)
    except TypeError:
        return False
    return True


def split_list(l, n):
    """`l` in n consecutive parts whose lengths differ by at most one (the first ones longer)."""
    d, r = divmod(len(l), n)
    return [l[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def num_rank_is_power_2(num_rank):
    """True when num_rank (> 0) is a power of 2."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0
