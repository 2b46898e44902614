"""The Ray actor each Conflux worker of a RayExecutor runs in (Horovod's BaseHorovodWorker): it
holds the worker's environment (set before the user's code imports or initializes Conflux), the
optional executable object, and runs the functions the driver sends.

A function that raises ends this process's Conflux world first (conflux.shutdown(), when Conflux
was initialized here): the other workers, which may be waiting for this one in a collective, then
fail at once with ShutDownError instead of waiting for a stall deadline, and the driver reports
this worker's own exception. The next function that calls conflux.init() (hvd.init()) forms a new
world of the same workers.

Each run has a number from the driver. A failing worker marks its run ended in the driver's store
(run_ended_key) before it ends its world; a worker whose task of that run starts late, or whose
conflux.init() would form a new world in it, reads the mark and ends with RunEndedError instead of
waiting for peers that have moved on. The worlds formed in a run meet in that run's key space
(CFX_RENDEZVOUS_SCOPE), so even an unmarked late join never meets a later run's workers.
"""
import contextlib
import os
import socket
import sys

import ray

from ._common import RunEndedError, _world_lost, mark_run_ended, run_ended_key, run_scope


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
            with self._run(None):
                self.executable = executable_cls(*(executable_args or []),
                                                 **(executable_kwargs or {}))

    def execute(self, fn, run_id=None):
        """fn(executable), as part of run `run_id`."""
        with self._run(run_id):
            return fn(self.executable)

    def run(self, fn, args=None, kwargs=None, run_id=None):
        """fn(*args, **kwargs), as part of run `run_id`."""
        with self._run(run_id):
            return fn(*(args or ()), **(kwargs or {}))

    # ---- runs ----
    _store = None  # a client of the driver's store, made at the first run that needs it

    def _driver_store(self):
        if self._store is None:
            host, _, port = os.environ["CFX_RENDEZVOUS_ADDR"].rpartition(":")
            from .._store import StoreClient
            self._store = StoreClient(host, int(port), timeout_s=10)
        return self._store

    def _ended_by(self, run_id):
        """The rank whose failure ended run `run_id`, as marked in the driver's store, or None
        (also when the store cannot be read: then the run goes on as if unmarked)."""
        try:
            value = self._driver_store().get(run_ended_key(run_id))
        except Exception:  # noqa: BLE001 (no mark to read: the scope still keeps runs apart)
            return None
        return None if value is None else value.decode(errors="replace")

    def _check_run(self, run_id, doing):
        by = self._ended_by(run_id)
        if by is not None:
            raise RunEndedError("run %d had already failed on rank %s before this worker (rank %s) "
                                "%s" % (run_id, by, os.environ.get("CFX_RANK", "?"), doing))

    @contextlib.contextmanager
    def _run(self, run_id):
        """One task of run `run_id`: its worlds meet in the run's key space; it does not start,
        nor form a new world, once the run is marked ended; its failure marks the run ended
        (first) and ends this process's world. run_id None (the executable's construction, an
        elastic job's function: nothing numbers them): a failure only ends the world."""
        core = None
        try:
            if run_id is not None:
                os.environ["CFX_RENDEZVOUS_SCOPE"] = run_scope(run_id)
                from .. import _core as core
                core._before_new_world = lambda: self._check_run(run_id,
                                                                 "formed a new world in it")
                self._check_run(run_id, "started its function")
            yield
        except BaseException as exc:
            # A cause (not a consequence: a world shut down, a run marked ended) marks the run.
            if run_id is not None and not _world_lost(exc):
                try:
                    mark_run_ended(self._driver_store(), run_id, os.environ.get("CFX_RANK", "?"))
                except Exception:  # noqa: BLE001 (the failure itself is what to report)
                    pass
            _end_world()
            raise
        finally:
            if core is not None:
                core._before_new_world = None

    def run_elastic(self, fn, args, kwargs, with_executable):
        """An elastic job's function: fn(executable) or fn(*args, **kwargs); returns (this
        worker's rank in the world it ended in, or None without Conflux, the result)."""
        with self._run(None):
            result = fn(self.executable) if with_executable else fn(*(args or ()),
                                                                    **(kwargs or {}))
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
