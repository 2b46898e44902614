"""bench/lang's C loops for Python (bench-only; loops.h): ctypes over build/bench/lang's
libcfx_bench_loops.so, which ctypes calls with the GIL released, so the C loop runs in this
process under the same load as the Python calls it is compared with.

    import bench_loops  # bench/lang on sys.path
    times = bench_loops.allreduce(conflux._core.current().address, n)   # n times in us
    times = bench_loops.gradset(int(native_set.ptr), count, n)          # n step times in us
"""
import ctypes
import os

import conflux

_BUILD = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(conflux.__file__))))
_lib = ctypes.CDLL(os.environ.get("CFX_BENCH_LOOPS", os.path.join(_BUILD, "bench", "lang",
                                                                   "libcfx_bench_loops.so")))
_lib.cfx_bench_allreduce_loop.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_double))
_lib.cfx_bench_gradset_loop.argtypes = (ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
                                        ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double))


def _checked(st):
    if st != 0:
        conflux._capi.cfx_py_raise_status(st, conflux._capi.cfx_last_error())


def allreduce(ctx_address, n):
    """n times (us) of a blocking 1-element float32 allreduce from C on the context at the address."""
    out = (ctypes.c_double * max(n, 1))()
    _checked(_lib.cfx_bench_allreduce_loop(ctx_address, n, out))
    return list(out[:n])


def gradset(set_address, count, n):
    """n step times (us) of the committed gradient set at the address, from C."""
    out = (ctypes.c_double * max(n, 1))()
    _checked(_lib.cfx_bench_gradset_loop(set_address, count, n, out, None))
    return list(out[:n])
