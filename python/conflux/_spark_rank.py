"""The process conflux.spark runs a rank's fn in: `python -m conflux._spark_rank JOB RESULT PARENT`.

JOB holds (fn, args, kwargs) as pyspark's cloudpickle wrote them on the driver. RESULT gets
("ok", the result pickled) or ("error", {"type", "message", "traceback"}), written whole (a rename)
as soon as fn returned or raised, before the engine shuts down at exit: the task reports a failure
from it at once. The world is in the environment the task set (CFX_RANK, CFX_SIZE, ...). The
process dies with PARENT, the task's Python worker (Spark kills the worker to cancel a task; a
lost executor's daemon takes its workers down with it).
"""
import os
import pickle
import sys
import traceback


def _write(path, status, payload):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(pickle.dumps((status, payload)))
    os.rename(tmp, path)


def _die_with_parent(parent):
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent went before prctl took effect
        os._exit(1)


def main(job, result, parent):
    _die_with_parent(int(parent))
    from pyspark import cloudpickle

    try:
        with open(job, "rb") as f:
            fn, args, kwargs = pickle.load(f)
        value = fn(*args, **kwargs)
        try:
            out = cloudpickle.dumps(value)
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"fn's result cannot be pickled: {type(e).__name__}: {e}") from e
    except BaseException as e:  # noqa: BLE001  (SystemExit and KeyboardInterrupt are failures too)
        sys.stdout.flush()
        _write(result, "error", {"type": type(e).__name__, "message": str(e),
                                 "traceback": traceback.format_exc()})
        return 1
    sys.stdout.flush()
    _write(result, "ok", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
