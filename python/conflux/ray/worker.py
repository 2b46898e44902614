"""The Ray actor each Conflux worker of a RayExecutor runs in (Horovod's BaseHorovodWorker): it
holds the worker's environment (set before the user's code imports or initializes Conflux), the
optional executable object, and runs the functions the driver sends.

A function that raises ends this process's Conflux world first (conflux.shutdown(), when Conflux
was initialized here): the other workers, which may be waiting for this one in a collective, then
fail at once with ShutDownError instead of waiting for a stall deadline, and the driver reports
this worker's own exception. The next function that calls conflux.init() (hvd.init()) forms a new
world of the same workers.
"""
import os
import socket
import sys

import ray


def _end_world():
    """conflux.shutdown() if this process initialized Conflux (imported and running)."""
    core = sys.modules.get("conflux._core")
    if core is None:
        return
    try:
        if core.is_initialized():
            core.shutdown()
    except Exception:  # the world may be gone already: nothing else to end
        pass


class Worker:
    """One worker: `env` (the CFX_* and HOROVOD_* variables of its place in the world) goes into
    os.environ first."""

    executable = None

    def __init__(self, env=None):
        if env:
            os.environ.update({k: str(v) for k, v in env.items()})

    # ---- where it landed ----
    def info(self):
        """(node id, host name, node IP, pid, GPU ids) of this worker."""
        ctx = ray.get_runtime_context()
        try:
            gpus = [str(g) for g in ray.get_gpu_ids()]
        except Exception:
            gpus = []
        return (ctx.get_node_id(), socket.gethostname(), ray.util.get_node_ip_address(),
                os.getpid(), gpus)

    def node_id(self):
        return ray.get_runtime_context().get_node_id()

    def hostname(self):
        return socket.gethostname()

    def get_gpu_ids(self):
        return ray.get_gpu_ids()

    # ---- environment ----
    def update_env_vars(self, env_vars):
        """Sets variables in this worker's process (before Conflux initializes, to take effect)."""
        os.environ.update({k: str(v) for k, v in env_vars.items()})

    def env_vars(self):
        return dict(os.environ)

    # ---- work ----
    def start_executable(self, executable_cls=None, executable_args=None,
                         executable_kwargs=None):
        """Makes executable_cls(*args, **kwargs) the object execute() hands to functions."""
        if executable_cls is not None:
            try:
                self.executable = executable_cls(*(executable_args or []),
                                                 **(executable_kwargs or {}))
            except BaseException:
                _end_world()
                raise

    def execute(self, fn):
        """fn(executable)."""
        try:
            return fn(self.executable)
        except BaseException:
            _end_world()
            raise

    def run(self, fn, args=None, kwargs=None):
        """fn(*args, **kwargs)."""
        try:
            return fn(*(args or ()), **(kwargs or {}))
        except BaseException:
            _end_world()
            raise

    def run_elastic(self, fn, args, kwargs, with_executable):
        """An elastic job's function: fn(executable) or fn(*args, **kwargs); returns (this
        worker's rank in the world it ended in, or None without Conflux, the result)."""
        try:
            result = fn(self.executable) if with_executable else fn(*(args or ()),
                                                                    **(kwargs or {}))
        except BaseException:
            _end_world()
            raise
        core = sys.modules.get("conflux._core")
        rank = None
        if core is not None:
            try:
                rank = core.rank() if core.is_initialized() else None
            except Exception:  # noqa: BLE001 (ended: no rank to give)
                rank = None
        return rank, result

    def ping(self):
        return os.getpid()
