"""RayExecutor: Horovod's horovod.ray.RayExecutor on Conflux (docs/ray.md).

The driver (the process that calls start()) places the workers as Ray actors through a placement
group (num_workers: one bundle per worker, PACK; num_hosts x num_workers_per_host: one bundle per
host, STRICT_SPREAD, as Horovod's ColocatedStrategy), serves the job's rendezvous store (the
engine's TCP store, through the C ABI: conflux._store), and gives each worker its place in
the world before its process starts: ranks grouped by the Ray node the worker landed on (the nodes
in the order of their first bundle), local rank and size within the node, Horovod's cross rank and
size, CFX_RENDEZVOUS_ADDR=<driver's node IP>:<port> with CFX_RENDEZVOUS_EXTERNAL=1 and
CFX_TRANSPORT=gloo. conflux.init() (hvd.init()) in the workers then meets there over Gloo.

run() returns the workers' results in rank order. When a worker fails, run() raises WorkerError
naming the rank, the Ray node and host, and the worker's exception (or how its actor died); the
other workers' errors that only follow from it (a lost peer, a world shut down) are not what it
reports. It never waits for the others longer than the transport's deadline after a failure.
"""
import logging
import os
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.placement_group import (get_current_placement_group, placement_group,
                                      placement_group_table, remove_placement_group)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ._common import (_ROOT_CAUSE_MARGIN_S, RunEndedError, Settings,  # noqa: F401 (API)
                      WorkerError, driver_address, forwarded_env, gather, mark_run_ended,
                      transport_deadline)
from .._store import StoreServer
from .elastic import ElasticAdapter
from .worker import Worker

logger = logging.getLogger(__name__)

def world_env(slots):
    """Ranks from where the workers landed. `slots`: the node id of each worker, in creation
    order. Returns (order, per-rank variables): order[r] is the slot that gets rank r; ranks are
    grouped by node (the nodes in order of first appearance), local ranks in creation order,
    cross rank/size as Horovod counts them (among the nodes' workers of the same local rank)."""
    by_node = OrderedDict()
    for slot, node in enumerate(slots):
        by_node.setdefault(node, []).append(slot)
    order = [slot for group in by_node.values() for slot in group]
    cross_size = {}
    for group in by_node.values():
        for local in range(len(group)):
            cross_size[local] = cross_size.get(local, 0) + 1
    envs, seen = [], {}
    for node, group in by_node.items():
        for local, slot in enumerate(group):
            cross = seen.get(local, 0)
            seen[local] = cross + 1
            rank = len(envs)
            envs.append({
                "CFX_RANK": rank, "CFX_SIZE": len(slots),
                "CFX_LOCAL_RANK": local, "CFX_LOCAL_SIZE": len(group),
                "HOROVOD_RANK": rank, "HOROVOD_SIZE": len(slots),
                "HOROVOD_LOCAL_RANK": local, "HOROVOD_LOCAL_SIZE": len(group),
                "HOROVOD_CROSS_RANK": cross, "HOROVOD_CROSS_SIZE": cross_size[local],
                "HOROVOD_HOSTNAME": node,
            })
    return order, envs


class _Placement:
    """The placement group and where each worker slot goes in it: (bundle index, node id)."""

    def __init__(self, bundles, strategy, slots_per_bundle, timeout_s, inherit):
        self.created = False
        self.pg = get_current_placement_group() if inherit else None
        if self.pg is not None:
            logger.info("conflux.ray: using the current placement group (use_current_placement_"
                        "group=False makes one of the executor's own)")
            n = len(bundles) * slots_per_bundle
            self.slots = [(-1, None)] * n
            return
        self.pg = placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([self.pg.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(self.pg)
            raise TimeoutError(
                "conflux.ray: Ray could not place the workers within %s s (placement group of %d "
                "bundle(s) %s, strategy %s); available now: %s" % (
                    timeout_s, len(bundles), bundles[0], strategy, ray.available_resources()))
        self.created = True
        nodes = placement_group_table(self.pg).get("bundles_to_node_id", {})
        self.slots = [(b, nodes.get(b)) for b in range(len(bundles))
                      for _ in range(slots_per_bundle)]

    def remove(self):
        if self.created and self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 (the cluster may be going down)
                pass
        self.pg = None


class StaticAdapter:
    """A fixed world of Ray actors (RayExecutor without min_workers)."""

    def __init__(self, settings, num_workers=None, num_hosts=None, num_workers_per_host=1,
                 cpus_per_worker=1, use_gpu=False, gpus_per_worker=None,
                 use_current_placement_group=True):
        if num_workers is None and num_hosts is None:
            raise ValueError("RayExecutor: give num_workers, or num_hosts and "
                             "num_workers_per_host (or min_workers for an elastic job)")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("RayExecutor: give num_workers or num_hosts, not both")
        self.settings = settings
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host or 1
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.workers = []
        self.places = []  # (node id, host name, pid) by rank
        self.store = None
        self.placement = None
        self.env = {}
        self._runs = 0         # runs started (each names its key space and its ended mark)
        self._unfinished = []  # (rank, ref) of the last failed run's tasks still running

    @property
    def world_size(self):
        return self.num_workers if self.num_workers else self.num_hosts * self.num_workers_per_host

    def _bundles(self):
        per = {"CPU": self.cpus_per_worker}
        if self.use_gpu:
            per["GPU"] = self.gpus_per_worker
        if self.num_workers:
            return [dict(per) for _ in range(self.num_workers)], "PACK", 1
        k = self.num_workers_per_host
        return [{key: v * k for key, v in per.items()} for _ in range(self.num_hosts)], \
            "STRICT_SPREAD", k

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars=None):
        if self.workers:
            raise RuntimeError("RayExecutor.start: already started (shutdown() first)")
        bundles, strategy, per_bundle = self._bundles()
        self.placement = _Placement(bundles, strategy, per_bundle,
                                    self.settings.placement_group_timeout_s,
                                    self.use_current_placement_group)
        try:
            self._start(executable_cls, executable_args, executable_kwargs, extra_env_vars or {})
        except BaseException:
            self.shutdown()
            raise

    def _start(self, executable_cls, executable_args, executable_kwargs, extra_env_vars):
        self.store = StoreServer(int(os.environ.get("CFX_RENDEZVOUS_PORT", "0") or 0))
        common = forwarded_env()
        common.update({
            "CFX_RENDEZVOUS_ADDR": "%s:%d" % (driver_address(), self.store.port),
            "CFX_RENDEZVOUS_EXTERNAL": "1", "CFX_TRANSPORT": "gloo",
            "CFX_RENDEZVOUS_TIMEOUT_S": str(self.settings.timeout_s),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "PYTHONUNBUFFERED": "1",
        })
        common.update({k: str(v) for k, v in extra_env_vars.items()})
        self.env = common
        remote = ray.remote(Worker)
        known = all(node is not None for _, node in self.placement.slots)
        if known:
            # Ray placed the bundles: every worker's place is known before its process starts.
            order, envs = world_env([node for _, node in self.placement.slots])
            workers = [None] * len(order)
            for rank, slot in enumerate(order):
                env = dict(common)
                env.update({k: str(v) for k, v in envs[rank].items()})
                workers[rank] = self._actor(remote, self.placement.slots[slot][0], env)
            self.workers = workers
            infos = ray.get([w.info.remote() for w in self.workers])
        else:
            # An inherited placement group: place first, then tell each its rank (still before
            # any of the user's code runs there).
            workers = [self._actor(remote, -1, dict(common)) for _ in self.placement.slots]
            infos = ray.get([w.info.remote() for w in workers])
            order, envs = world_env([info[0] for info in infos])
            self.workers = [workers[slot] for slot in order]
            infos = [infos[slot] for slot in order]
            ray.get([w.update_env_vars.remote(envs[r]) for r, w in enumerate(self.workers)])
        self.places = [(info[0], info[1], info[3]) for info in infos]
        if self.use_gpu:
            self._share_gpus(infos)
        ray.get([w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                 for w in self.workers])

    def _actor(self, remote, bundle, env):
        options = dict(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                       scheduling_strategy=PlacementGroupSchedulingStrategy(
                           self.placement.pg, placement_group_bundle_index=bundle,
                           placement_group_capture_child_tasks=False),
                       runtime_env={"env_vars": {k: str(v) for k, v in env.items()}})
        return remote.options(**options).remote()

    def _share_gpus(self, infos):
        """CUDA_VISIBLE_DEVICES: every GPU of the node's workers, in local-rank order (local
        rank i uses device i), as Horovod does, so the node's ranks see one another's devices."""
        by_node = OrderedDict()
        for info in infos:
            by_node.setdefault(info[0], []).extend(info[4])
        ray.get([w.update_env_vars.remote({"CUDA_VISIBLE_DEVICES": ",".join(by_node[info[0]])})
                 for w, info in zip(self.workers, infos)])

    # ---- running ----
    def _check(self):
        if not self.workers:
            raise RuntimeError("RayExecutor: not started (call start() first)")

    def _grace(self):
        return transport_deadline(self.env) + _ROOT_CAUSE_MARGIN_S

    def _new_run(self):
        """The next run's number, once the last failed run's tasks are all over (worker.py: a run
        that starts while a worker still runs the failed one would wait for it)."""
        self._check()
        if self._unfinished:
            limit = float(self.settings.timeout_s) + self._grace()
            _, pending = ray.wait([ref for _, ref in self._unfinished],
                                  num_returns=len(self._unfinished), timeout=limit)
            self._unfinished = [(r, ref) for r, ref in self._unfinished if ref in pending]
            if self._unfinished:
                many = len(self._unfinished) > 1
                raise RuntimeError(
                    "RayExecutor: rank%s %s still run%s the function of the run that failed, "
                    "%.0f s after it was reported; shut the executor down (shutdown()) and start "
                    "a new one" % ("s" if many else "",
                                   ", ".join(str(r) for r, _ in self._unfinished),
                                   "" if many else "s", limit))
        self._runs += 1
        return self._runs

    def _gather(self, refs, run_id, what, places=None):
        def mark_ended(rank):
            try:
                mark_run_ended(self.store, run_id, rank)
            except Exception:  # noqa: BLE001 (closed: the workers are gone with it)
                pass
        return gather(refs, places or self.places, what, self._grace(), on_cause=mark_ended,
                      unfinished=self._unfinished)

    def execute(self, fn):
        run_id = self._new_run()
        return self._gather([w.execute.remote(fn, run_id) for w in self.workers], run_id,
                            "RayExecutor.execute")

    def run(self, fn, args=None, kwargs=None):
        run_id = self._new_run()
        return self._gather(self._run_refs(fn, args, kwargs, run_id), run_id, "RayExecutor.run")

    def run_remote(self, fn, args=None, kwargs=None):
        return self._run_refs(fn, args, kwargs, self._new_run())

    def _run_refs(self, fn, args, kwargs, run_id):
        return [w.run.remote(fn, list(args or []), dict(kwargs or {}), run_id)
                for w in self.workers]

    def execute_single(self, fn):
        run_id = self._new_run()
        return self._gather([self.workers[0].execute.remote(fn, run_id)], run_id,
                            "RayExecutor.execute_single", self.places[:1])[0]

    def shutdown(self):
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 (dead already)
                pass
        self.workers = []
        self._unfinished = []
        if self.placement is not None:
            self.placement.remove()
            self.placement = None
        if self.store is not None:
            self.store.close()
            self.store = None


class RayExecutor:
    """Horovod's horovod.ray.RayExecutor on Conflux: workers are Ray actors placed by a placement
    group, meeting over Gloo through a store this process serves.

        executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=4)
        executor.start()
        results = executor.run(train_fn, args=[...])   # train_fn calls conflux.init() / hvd.init()
        executor.shutdown()

    num_workers places one bundle per worker with PACK (the current placement group when the
    executor runs inside one and use_current_placement_group); num_hosts with
    num_workers_per_host places one bundle per host with STRICT_SPREAD. min_workers (with
    max_workers, reset_limit, cooldown_range, elastic_timeout) makes it elastic: see
    conflux.ray.elastic and docs/ray.md."""

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None):
        """Horovod's signature. timeout_s: the rendezvous deadline; placement_group_timeout_s:
        how long Ray may take to place the workers. ssh_str is written to ssh_identity_file as
        Horovod does (Ray starts the workers here, so neither is used)."""
        if ssh_str and ssh_identity_file and not os.path.exists(ssh_identity_file):
            with open(ssh_identity_file, "w") as f:
                os.chmod(ssh_identity_file, 0o600)
                f.write(ssh_str)
        return Settings(timeout_s=timeout_s, ssh_identity_file=ssh_identity_file,
                        placement_group_timeout_s=placement_group_timeout_s, nics=nics)

    def __init__(self, settings=None, num_workers: Optional[int] = None,
                 num_hosts: Optional[int] = None, num_workers_per_host: int = 1,
                 cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[int] = None, use_current_placement_group: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 reset_limit: Optional[int] = None, cooldown_range=None,
                 elastic_timeout: int = 600, override_discovery: bool = True):
        if gpus_per_worker and not use_gpu:
            raise ValueError("RayExecutor: gpus_per_worker is set, but use_gpu is False")
        if use_gpu and isinstance(gpus_per_worker, int) and gpus_per_worker < 1:
            raise ValueError("RayExecutor: gpus_per_worker must be >= 1, not %d" % gpus_per_worker)
        if max_workers and (not min_workers or min_workers <= 0):
            raise ValueError("RayExecutor: max_workers given without a positive min_workers "
                             "(an elastic job needs min_workers)")
        if min_workers is not None and num_workers is not None:
            raise ValueError("RayExecutor: give num_workers (a fixed world) or min_workers (an "
                             "elastic one), not both")
        self.settings = settings if settings is not None else self.create_settings()
        if min_workers is not None:
            self.settings.elastic = True
            self.adapter = ElasticAdapter(
                self.settings, min_workers=min_workers, max_workers=max_workers,
                reset_limit=reset_limit, cooldown_range=cooldown_range,
                elastic_timeout=elastic_timeout, override_discovery=override_discovery,
                cpus_per_worker=cpus_per_worker, use_gpu=use_gpu, gpus_per_worker=gpus_per_worker)
        else:
            self.adapter = StaticAdapter(
                self.settings, num_workers=num_workers, num_hosts=num_hosts,
                num_workers_per_host=num_workers_per_host, cpus_per_worker=cpus_per_worker,
                use_gpu=use_gpu, gpus_per_worker=gpus_per_worker,
                use_current_placement_group=use_current_placement_group)

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None, extra_env_vars: Optional[Dict] = None):
        """Places the workers, serves the store, gives each its place in the world (before the
        user's code runs there) and makes executable_cls(*executable_args, **executable_kwargs)
        in each (the object execute() passes to its function). extra_env_vars: more variables
        for every worker."""
        return self.adapter.start(executable_cls=executable_cls, executable_args=executable_args,
                                  executable_kwargs=executable_kwargs,
                                  extra_env_vars=extra_env_vars)

    def execute(self, fn: Callable[[Any], Any], callbacks=None) -> List[Any]:
        """fn(executable) on every worker; the results in rank order."""
        return self.adapter.execute(fn)

    def run(self, fn: Callable[..., Any], args: Optional[List] = None,
            kwargs: Optional[Dict] = None, callbacks=None) -> List[Any]:
        """fn(*args, **kwargs) on every worker; the results in rank order. A failed worker
        raises WorkerError (its rank, Ray node, host and exception, or how its actor died)."""
        return self.adapter.run(fn, args=args, kwargs=kwargs)

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List["ray.ObjectRef"]:
        """fn(*args, **kwargs) on every worker: one object ref per rank, in rank order."""
        return self.adapter.run_remote(fn, args=args, kwargs=kwargs)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable) on rank 0 only."""
        return self.adapter.execute_single(fn)

    def shutdown(self):
        """Ends the workers (their actors are killed), removes the placement group and stops
        serving the store."""
        return self.adapter.shutdown()

    # What Horovod's executor exposes besides its methods.
    @property
    def workers(self):
        return list(self.adapter.workers)

    @property
    def num_workers(self):
        return len(self.adapter.workers)
