"""Elastic jobs on Ray: RayExecutor(settings, min_workers=..., max_workers=...) and Horovod's older
ElasticRayExecutor (docs/ray.md, docs/elastic.md).

The membership is the engine's (engine/membership.c: rounds through the job's store, decided by
the survivors); this driver does on Ray what tools/cfx_elastic.py does for cfxrun --elastic: it
serves the store, finds the nodes from Ray (RayHostDiscovery: every alive node, its CPUs (and
GPUs) divided by what a worker takes), starts one Ray actor per slot pinned to its node, with
CFX_ELASTIC=1, CFX_ELASTIC_ID, the first world's CFX_RANK/CFX_SIZE, CFX_RENDEZVOUS_ADDR and the
job's minimum, maximum and round deadline, and reports what the rounds cannot see for themselves:
a worker whose function failed or whose actor died is marked gone in the store (the next round
does not wait for it), its node is blacklisted (for a time drawn from cooldown_range, else for
the rest of the job) and the node's other workers are stopped and marked gone too, so the node
leaves the world whole at the next round, as Horovod's driver does. A node that leaves the Ray
cluster takes its workers with it: they are marked gone as soon as Ray no longer lists the node
alive. Nodes that join (or free slots) get newcomers, which the next commit lets in.

The training function is Horovod's elastic one: conflux.elastic.run / hvd.elastic.run around a
State that commits (docs/elastic.md). run() returns the results of the final world's members in
rank order, or raises WorkerError / RuntimeError naming why the job could not go on.
"""
import logging
import math
import os
import random
import time
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._store import StoreServer
from ._common import (Settings, WorkerError, _actor_died, _short, died_reason, driver_address,
                      forwarded_env, transport_deadline)
from .worker import Worker

logger = logging.getLogger(__name__)

DISCOVERY_PERIOD_S = 1.0
# How long the final world's members get to end once one of them ended well: the transport's
# deadline plus this (as cfx_elastic gives them).
FINISH_MARGIN_S = 15.0


class RayHostDiscovery:
    """Horovod's RayHostDiscovery: the alive nodes of the Ray cluster and how many workers each
    takes (its CPUs // cpus_per_worker, and GPUs // gpus_per_worker with use_gpu). The host of a
    slot is the Ray node id, not its address: several nodes may share one address (Ray's
    multi-node test cluster on one machine, nodes in containers)."""

    def __init__(self, use_gpu=False, cpus_per_worker=1, gpus_per_worker=1, cpus_per_slot=None,
                 gpus_per_slot=None):
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_slot or cpus_per_worker or 1
        self.gpus_per_worker = gpus_per_slot or gpus_per_worker or 1

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        hosts = {}
        for node in ray.nodes():
            if not node.get("Alive", node.get("alive")):
                continue
            resources = node.get("Resources", {})
            slots = resources.get("CPU", 0) // self.cpus_per_worker
            if self.use_gpu:
                slots = min(slots, resources.get("GPU", 0) // self.gpus_per_worker)
            slots = int(math.ceil(slots))
            if slots > 0:
                hosts[node["NodeID"]] = slots
        return hosts


class ElasticSettings(Settings):
    """ElasticRayExecutor.create_settings(): Settings plus the elastic job's bounds."""

    def __init__(self, min_num_proc=1, max_num_proc=None, reset_limit=None, elastic_timeout=600,
                 timeout_s=30, cooldown_range=None, discovery=None, verbose=1, **kwargs):
        super().__init__(timeout_s=timeout_s, verbose=verbose, elastic=True,
                         **{k: v for k, v in kwargs.items() if k in Settings.__dataclass_fields__})
        self.min_num_proc = min_num_proc
        self.max_num_proc = max_num_proc
        self.reset_limit = reset_limit
        self.elastic_timeout = elastic_timeout
        self.cooldown_range = cooldown_range
        self.discovery = discovery
        self.num_proc = min_num_proc


class _Member:
    __slots__ = ("wid", "actor", "ref", "node", "local_rank", "pid")

    def __init__(self, wid, actor, node, local_rank):
        self.wid, self.actor, self.node, self.local_rank = wid, actor, node, local_rank
        self.ref = None
        self.pid = "?"


class ElasticAdapter:
    """The elastic driver of one RayExecutor: each run() is an elastic job of its own (fresh
    workers, a fresh store)."""

    def __init__(self, settings, min_workers, max_workers=None, reset_limit=None,
                 cooldown_range=None, elastic_timeout=600, override_discovery=True,
                 cpus_per_worker=1, use_gpu=False, gpus_per_worker=None, discovery=None):
        if min_workers is None or min_workers < 1:
            raise ValueError("elastic RayExecutor: min_workers must be at least 1")
        if max_workers is not None and max_workers < min_workers:
            raise ValueError("elastic RayExecutor: max_workers (%d) < min_workers (%d)"
                             % (max_workers, min_workers))
        self.settings = settings
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.reset_limit = reset_limit
        self.cooldown_range = tuple(cooldown_range) if cooldown_range else None
        self.elastic_timeout = elastic_timeout
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        if discovery is None and (override_discovery or
                                  getattr(settings, "discovery", None) is None):
            discovery = RayHostDiscovery(use_gpu=use_gpu, cpus_per_worker=cpus_per_worker,
                                         gpus_per_worker=self.gpus_per_worker or 1)
        self.discovery = discovery or settings.discovery
        self.started = False
        self.executable = (None, None, None)
        self.extra_env = {}
        self.members = {}  # live workers of the running job: id -> _Member
        self.actors = []   # every actor of the running (or last) job
        self.store = None
        self.job = None  # the running (or last) job
        # What the last run saw (tests and logs read them): the sizes of the worlds it formed.
        self.world_sizes = []

    # ---- Horovod's adapter API ----
    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars=None):
        """Checks that the cluster has the minimum's slots (waiting up to timeout_s for them)
        and keeps what every worker gets; the workers start with each run()."""
        self.executable = (executable_cls, executable_args, executable_kwargs)
        self.extra_env = dict(extra_env_vars or {})
        deadline = time.monotonic() + float(self.settings.timeout_s)
        while True:
            slots = sum(self.discovery.find_available_hosts_and_slots().values())
            if slots >= self.min_workers:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("elastic RayExecutor: the Ray cluster has %d slot(s) of %s "
                                   "CPU(s), fewer than min_workers (%d), after %s s"
                                   % (slots, self.cpus_per_worker, self.min_workers,
                                      self.settings.timeout_s))
            time.sleep(DISCOVERY_PERIOD_S)
        self.started = True

    def run(self, fn, args=None, kwargs=None):
        return _Job(self, ("run", fn, list(args or []), dict(kwargs or {}))).run()

    def execute(self, fn):
        return _Job(self, ("execute", fn, None, None)).run()

    def run_remote(self, fn, args=None, kwargs=None):
        raise NotImplementedError("an elastic RayExecutor runs whole jobs: use run() (its "
                                  "workers change while it runs; Horovod's elastic executor has "
                                  "no run_remote either)")

    def execute_single(self, fn):
        raise NotImplementedError("an elastic RayExecutor runs whole jobs: use execute()")

    def shutdown(self):
        for actor in self.actors:
            _kill(actor)
        self.actors = []
        self.members = {}
        if self.store is not None:
            self.store.close()
            self.store = None
        self.started = False

    @property
    def workers(self):
        return [m.actor for m in self.members.values()]


def _kill(actor):
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 (gone already)
        pass


def _say(msg):
    logger.warning("conflux.ray elastic: %s", msg)


class _Job:
    """One elastic run: starts the workers, watches them and Ray's nodes, ends with the results
    of the final world or the reason it could not go on."""

    def __init__(self, adapter, call):
        if not adapter.started:
            raise RuntimeError("RayExecutor: not started (call start() first)")
        self.a = adapter
        adapter.job = self
        self.call = call
        self.first = 0
        self.next_id = 0
        self.members = adapter.members = {}
        self.actors = adapter.actors = []  # every worker actor the job started
        self.results = {}      # id -> (rank, result)
        self.failures = []     # (id, node, exception), in the order seen
        self.stopped = []      # ids stopped on purpose (their node blacklisted, or outsiders)
        self.blacklist = {}    # node -> time its cooldown ends
        self.resets = 0
        self.hosts = {}
        self.last_discovery = 0.0
        self.succeeded_at = None

    # ---- slots and workers ----
    def discover(self, now, force=False):
        if not force and now - self.last_discovery < DISCOVERY_PERIOD_S:
            return
        self.last_discovery = now
        try:
            hosts = self.a.discovery.find_available_hosts_and_slots()
        except Exception as e:  # noqa: BLE001 (the GCS may be busy: keep the last answer)
            _say("host discovery failed: %s" % e)
            return
        for node in set(self.hosts) - set(hosts):
            on = [m for m in self.members.values() if m.node == node]
            if on:
                _say("Ray node %s left the cluster: its worker(s) %s are gone" % (
                    _short(node), ", ".join("id %d" % m.wid for m in on)))
            for m in on:
                self.lose(m, None, "its Ray node %s left the cluster" % _short(node), now)
        self.hosts = hosts

    def free_slots(self, now):
        free = {}
        for node, slots in self.hosts.items():
            if self.blacklist.get(node, 0) > now:
                continue
            used = sum(1 for m in self.members.values() if m.node == node)
            if slots > used:
                free[node] = slots - used
        return free

    def worker_env(self, wid, node, local_rank):
        a = self.a
        hosts = list(dict.fromkeys(list(self.hosts) + [m.node for m in self.members.values()]))
        env = forwarded_env()
        env.update({
            "CFX_ELASTIC": "1", "CFX_ELASTIC_ID": wid, "CFX_TRANSPORT": "gloo",
            "CFX_RANK": wid if wid < self.first else 0, "CFX_SIZE": self.first,
            "CFX_RENDEZVOUS_ADDR": self.store_addr, "CFX_RENDEZVOUS_EXTERNAL": "1",
            "CFX_RENDEZVOUS_TIMEOUT_S": a.settings.timeout_s,
            "CFX_ELASTIC_MIN_SIZE": a.min_workers,
            "CFX_ELASTIC_MAX_SIZE": a.max_workers or 0,
            "CFX_ELASTIC_TIMEOUT_S": a.elastic_timeout,
            "HOROVOD_HOSTNAME": node, "HOROVOD_RANK": wid, "HOROVOD_SIZE": self.first,
            "HOROVOD_LOCAL_RANK": local_rank, "HOROVOD_LOCAL_SIZE": self.hosts.get(node, 1),
            "HOROVOD_CROSS_RANK": hosts.index(node) if node in hosts else len(hosts),
            "HOROVOD_CROSS_SIZE": len(hosts), "HOROVOD_ELASTIC": "1",
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "PYTHONUNBUFFERED": "1",
        })
        if wid >= self.first:
            # A newcomer that finds no member of the last world in a round leads it, and a
            # leader decides without the members that did not come within the settle time: the
            # newcomers would form a world of their own while the members train towards their
            # next commit. A newcomer waits for them until the round's deadline instead (the
            # members still settle a silent peer in CFX_ELASTIC_SETTLE_S when one of them leads).
            env["CFX_ELASTIC_SETTLE_S"] = max(a.elastic_timeout, float(
                env.get("CFX_ELASTIC_SETTLE_S") or 0))
        env.update(a.extra_env)
        return {k: str(v) for k, v in env.items()}

    def start_worker(self, node):
        a = self.a
        wid = self.next_id
        self.next_id += 1
        taken = {m.local_rank for m in self.members.values() if m.node == node}
        local_rank = min(set(range(len(taken) + 1)) - taken)
        env = self.worker_env(wid, node, local_rank)
        actor = ray.remote(Worker).options(
            num_cpus=a.cpus_per_worker, num_gpus=a.gpus_per_worker,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            runtime_env={"env_vars": env}).remote()
        self.actors.append(actor)  # every actor of the job ends with it, finished ones too
        m = _Member(wid, actor, node, local_rank)
        cls, cargs, ckwargs = a.executable
        kind, fn, args, kwargs = self.call
        if cls is not None:
            actor.start_executable.remote(cls, cargs, ckwargs)
        m.ref = actor.run_elastic.remote(fn, args, kwargs, kind == "execute")
        self.members[wid] = m

    def mark_gone(self, wid):
        """Tells the membership rounds that `wid` is gone (engine/membership.h: gone/<id>)."""
        self.store.set("elastic/gone/%d" % wid, b"1")

    def lose(self, m, exc, why, now, failed=True):
        """Worker `m` is out of the job: marked gone, its actor ended; a failure blacklists its
        node and stops the node's other workers (the node leaves the world whole)."""
        if m.wid not in self.members:
            return
        del self.members[m.wid]
        self.mark_gone(m.wid)
        if failed:  # the node's other workers are gone too, before any actor ends: a round
            # deciding now must not count on one that is about to be stopped
            for other in [o for o in self.members.values() if o.node == m.node]:
                self.mark_gone(other.wid)
        _kill(m.actor)
        if not failed:
            self.stopped.append(m.wid)
            return
        self.failures.append((m.wid, m.node, exc, why))
        if self.succeeded_at is None:
            self.resets += 1
        cooldown = random.uniform(*self.a.cooldown_range) if self.a.cooldown_range \
            else float("inf")
        self.blacklist[m.node] = max(self.blacklist.get(m.node, 0), now + cooldown)
        _say("worker id %d on Ray node %s %s; node blacklisted%s" % (
            m.wid, _short(m.node), why,
            "" if self.a.cooldown_range is None else " for %.1f s" % cooldown))
        for other in [o for o in self.members.values() if o.node == m.node]:
            _say("stopping worker id %d on Ray node %s: its node is blacklisted (worker id %d "
                 "failed), so it leaves the world with the node" % (other.wid, _short(m.node),
                                                                   m.wid))
            self.lose(other, None, "", now, failed=False)

    def describe(self):
        """What the driver knows now, for a report: members, failures, rounds' decisions."""
        return ("members %s; failed %s; stopped %s; blacklisted %s; decisions %s" % (
            ", ".join("id %d on %s" % (m.wid, _short(m.node)) for m in self.members.values()),
            ", ".join("id %d (%s)" % (f[0], f[3]) for f in self.failures), self.stopped,
            [_short(n) for n in self.blacklist], self.decisions() if self.store else "-"))

    # ---- the store's view ----
    def decisions(self):
        """The rounds' decisions in the store: (round, text) by round. Rounds are decided in order
        (round N + 1 opens only on round N's decision), so they are read from round 1 on until one
        has none (as tools/cfx_elastic.py reads them)."""
        rounds = []
        while True:
            value = self.store.get("elastic/r%d/decision" % (len(rounds) + 1))
            if value is None:
                return rounds
            rounds.append((len(rounds) + 1, value.decode("utf-8", "replace")))

    def final_world(self):
        ids = set(range(self.first))
        for _, text in self.decisions():
            if text.startswith("ok"):
                ids = {int(i) for i in text[2:].split()}
        return ids

    def failed_round(self):
        failed = [text[5:] for _, text in self.decisions() if text.startswith("fail ")]
        return failed[0] if failed else None

    # ---- the job ----
    def fail(self, msg):
        """Ends the job: every worker stopped, WorkerError naming the first failure (if any)."""
        for m in list(self.members.values()):
            _kill(m.actor)
        self.members.clear()
        if self.failures:
            wid, node, exc, why = self.failures[0]
            text = "%s; the first worker lost: id %d on Ray node %s %s" % (msg, wid, _short(node),
                                                                          why)
            raise WorkerError("elastic RayExecutor: " + text, wid, node, None, None, exc,
                              {f[0]: f[2] for f in self.failures})
        raise RuntimeError("elastic RayExecutor: " + msg)

    def reap(self, now):
        refs = {m.ref: m for m in self.members.values()}
        if not refs:
            return
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0.1)
        for ref in ready:
            m = refs[ref]
            if m.wid not in self.members:
                continue  # stopped meanwhile with its node
            try:
                self.results[m.wid] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 (every failure is the job's business)
                if self.succeeded_at is not None and m.wid not in self.final_world():
                    self.lose(m, exc, "", now, failed=False)
                    continue
                why = ("died (%s)" % died_reason(exc)) if _actor_died(exc) else \
                    "failed: %s" % _first(getattr(exc, "cause", None) or exc)
                self.lose(m, exc, why, now)
                continue
            del self.members[m.wid]
            self.succeeded_at = self.succeeded_at or now

    def stop_outsiders(self, now):
        members = self.final_world()
        late = now - self.succeeded_at > self.grace
        for m in list(self.members.values()):
            if m.wid not in members or late:
                _say("stopping worker id %d on Ray node %s: %s" % (
                    m.wid, _short(m.node), "the job finished %.0f s ago" % self.grace if late
                    else "the job finished and it is not a member of the final world"))
                self.lose(m, None, "", now, failed=False)

    def run(self):
        a = self.a
        self.store = a.store = StoreServer(int(os.environ.get("CFX_RENDEZVOUS_PORT", "0") or 0))
        self.store_addr = "%s:%d" % (driver_address(), self.store.port)
        self.grace = transport_deadline(forwarded_env()) + FINISH_MARGIN_S
        try:
            return self._run()
        finally:
            # Every actor the job started, also those whose function returned: each holds its
            # CPUs (and GPUs) until it ends, which the next job would wait for.
            for actor in self.actors:
                _kill(actor)
            self.members.clear()
            a.world_sizes = self.world_sizes()
            self.store.close()
            self.store = a.store = None

    def world_sizes(self):
        """The sizes of the worlds the rounds formed (round 1: the first world)."""
        sizes = [len(text[2:].split()) for _, text in self.decisions() if text.startswith("ok")]
        return sizes or [self.first]

    def _run(self):
        a = self.a
        now = time.monotonic()
        self.discover(now, force=True)
        free = self.free_slots(now)
        total = sum(free.values())
        if total < a.min_workers:
            self.fail("cannot start: %d slot(s) on %d Ray node(s), fewer than min_workers %d"
                      % (total, len(free), a.min_workers))
        self.first = min(total, a.max_workers or total)
        for node, n in free.items():
            for _ in range(n):
                if self.next_id < self.first:
                    self.start_worker(node)
        while True:
            now = time.monotonic()
            self.reap(now)
            if self.succeeded_at is not None:
                self.stop_outsiders(now)
            if not self.members:
                break
            if self.succeeded_at is not None:
                continue
            if a.reset_limit is not None and self.resets > a.reset_limit:
                self.fail("the reset limit (%d) was reached: %d workers lost"
                          % (a.reset_limit, self.resets))
            failed = self.failed_round()
            if failed:
                self.fail("the job cannot go on: membership %s" % failed)
            self.discover(now)
            free = self.free_slots(now)
            if len(self.members) < a.min_workers and not free:
                every = self.hosts and all(self.blacklist.get(h, 0) > now for h in self.hosts)
                self.fail("%d worker(s) left, fewer than min_workers %d%s" % (
                    len(self.members), a.min_workers,
                    "; every node is blacklisted" if every else ""))
            for node, n in free.items():
                for _ in range(n):
                    if len(self.members) < (a.max_workers or 1 << 30):
                        self.start_worker(node)
        if self.succeeded_at is None:
            self.fail("every worker failed")
        final = self.final_world()
        done = sorted((rank if rank is not None else 1 << 30, wid, result)
                      for wid, (rank, result) in self.results.items() if wid in final)
        return [result for _, _, result in done]


def _first(exc):
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


class ElasticRayExecutor:
    """Horovod's (deprecated) ElasticRayExecutor on the same driver:

        settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4)
        executor = ElasticRayExecutor(settings, cpus_per_slot=1)
        executor.start()
        results = executor.run(train_fn)     # train_fn() uses hvd.elastic.run
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int = None,
                        reset_limit: int = None, elastic_timeout: int = 600,
                        timeout_s: int = 30, ssh_identity_file: str = None, nics: str = None,
                        min_np=None, max_np=None, **kwargs):
        return ElasticSettings(min_num_proc=min_np or min_num_proc,
                               max_num_proc=max_np or max_num_proc, reset_limit=reset_limit,
                               elastic_timeout=elastic_timeout, timeout_s=timeout_s,
                               ssh_identity_file=ssh_identity_file, nics=nics, **kwargs)

    def __init__(self, settings, use_gpu: bool = False, cpus_per_slot: int = 1,
                 gpus_per_slot: Optional[int] = None, env_vars: dict = None,
                 override_discovery=True):
        if gpus_per_slot and not use_gpu:
            raise ValueError("gpus_per_slot is set, but use_gpu is False")
        self.settings = settings
        self.env_vars = env_vars or {}
        self.adapter = ElasticAdapter(
            settings, min_workers=settings.min_num_proc, max_workers=settings.max_num_proc,
            reset_limit=settings.reset_limit,
            cooldown_range=getattr(settings, "cooldown_range", None),
            elastic_timeout=settings.elastic_timeout, override_discovery=override_discovery,
            cpus_per_worker=cpus_per_slot, use_gpu=use_gpu, gpus_per_worker=gpus_per_slot,
            discovery=None if override_discovery else settings.discovery)

    def start(self):
        self.adapter.start(extra_env_vars=self.env_vars)

    def run(self, worker_fn: Callable[[], Any], callbacks: Optional[List[Callable]] = None):
        """worker_fn() on every worker of the elastic job; the final world's results in rank
        order."""
        return self.adapter.run(worker_fn)

    def shutdown(self):
        self.adapter.shutdown()
