"""Which CUDA runtime and NCCL libconflux binds to inside an environment whose framework wheels
bring their own (torch's PyPI wheels depend on the nvidia-* wheels: libcudart.so.13 and
libnccl.so.2 under site-packages/nvidia/).

A process holds one library per soname. libconflux, built against the system's CUDA and NCCL
(/usr/local/cuda), names libcudart.so.13 and libnccl.so.2 too; whichever is loaded first serves
both. When conflux is imported before torch, the system's older NCCL would be the one, and torch's
libtorch_cuda.so then fails to load (it needs symbols only the wheel's newer NCCL has). So before
libconflux is loaded, the wheels' copies are loaded (RTLD_GLOBAL) when the environment has them:
the newer CUDA runtime and NCCL serve libconflux (their ABI is backward compatible) and torch
alike. Nothing happens where no such wheels are installed. Imported first by conflux/__init__.py.
"""
import ctypes
import importlib.util
import os

# In load order: NCCL needs the CUDA runtime.
_WHEEL_LIBRARIES = (("cu13", "libcudart.so.13"), ("nccl", "libnccl.so.2"))


def _nvidia_dirs():
    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []


def preload():
    """Loads the nvidia wheels' CUDA runtime and NCCL globally, where installed; returns the paths
    it loaded."""
    loaded = []
    try:
        roots = _nvidia_dirs()
    except (ImportError, ValueError):
        return loaded
    for package, soname in _WHEEL_LIBRARIES:
        for root in roots:
            path = os.path.join(root, package, "lib", soname)
            if os.path.exists(path):
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                loaded.append(path)
                break
    return loaded


LOADED = preload()
