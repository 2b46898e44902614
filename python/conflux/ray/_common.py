"""What the Ray executors share: their settings, the error a failed worker raises, how a run's
results are gathered and its failure told, and the variables every worker gets from the driver."""
import dataclasses
import os
import re
import time
from collections import OrderedDict
from typing import Optional

import ray
import ray.exceptions

# Driver variables a worker does not take over (the driver's own meeting place or launcher place).
_NOT_FORWARDED = {"CFX_RANK", "CFX_SIZE", "CFX_LOCAL_RANK", "CFX_LOCAL_SIZE", "CFX_RENDEZVOUS_DIR",
                  "CFX_RENDEZVOUS_PORT", "CFX_RENDEZVOUS_HOST", "CFX_RENDEZVOUS_ADDR",
                  "CFX_RENDEZVOUS_EXTERNAL", "CFX_ELASTIC", "CFX_ELASTIC_ID"}
# How much longer than the transport's deadline run() waits for the rest after a worker's error
# that only follows from another's (PeerLostError, ShutDownError): Ray's report of a dead actor
# may come after its peers noticed.
_ROOT_CAUSE_MARGIN_S = 5.0


@dataclasses.dataclass
class Settings:
    """RayExecutor.create_settings(): Horovod's MiniSettings. timeout_s is the rendezvous
    deadline (CFX_RENDEZVOUS_TIMEOUT_S of every worker: how long conflux.init() waits for the
    others); placement_group_timeout_s bounds the wait for Ray to place the workers. ssh_* and
    nics are accepted for Horovod's signature: Conflux's Gloo transport listens on the address a
    worker reaches the driver's store from, and Ray starts the workers, not ssh."""
    timeout_s: int = 30
    placement_group_timeout_s: int = 100
    ssh_identity_file: Optional[str] = None
    ssh_port: Optional[int] = None
    nics: Optional[set] = None
    verbose: int = 1
    elastic: bool = False


class WorkerError(RuntimeError):
    """A worker of a RayExecutor failed. `rank`, `node_id`, `hostname`, `pid`: which; `cause`: its
    exception (the worker's own, or Ray's ActorDiedError when its actor died); `errors`: every
    failed rank's exception, by rank."""

    def __init__(self, message, rank=None, node_id=None, hostname=None, pid=None, cause=None,
                 errors=None):
        super().__init__(message)
        self.rank = rank
        self.node_id = node_id
        self.hostname = hostname
        self.pid = pid
        self.cause = cause
        self.errors = errors or {}


WorkerError.__module__ = "conflux.ray"  # where users import it from (tracebacks say so)


class RunEndedError(RuntimeError):
    """A worker's part of a run that had already failed on another worker: the worker did not
    start the function, or its conflux.init() refused to form a new world in that run (the
    others had ended theirs), rather than wait there for peers that will not come."""


RunEndedError.__module__ = "conflux.ray"


def run_scope(run_id):
    """CFX_RENDEZVOUS_SCOPE of the worlds formed in a run: a late task of a failed run that
    forms one anyway meets no one of a later run (docs/ray.md, "When a worker fails")."""
    return "ray-run%d" % run_id


def run_ended_key(run_id):
    """The driver's store key a run's first failure sets (the failing rank): workers that have not
    yet started the run, or form a new world in it, read it and end with RunEndedError."""
    return "ray/run%d/ended" % run_id


def mark_run_ended(store, run_id, rank):
    """Marks run `run_id` ended by `rank`'s failure unless a failure marked it first (the store
    is the driver's StoreServer or a worker's StoreClient)."""
    key = run_ended_key(run_id)
    if store.get(key) is None:
        store.set(key, str(rank))


def _short(node_id):
    return (node_id or "?")[:12]


def _world_lost(exc):
    """Whether a worker's exception only follows from another worker's end (a lost peer, a world
    shut down or changed): then it is not the failure to report."""
    cause = getattr(exc, "cause", None) or exc
    try:
        from .. import _core
        kinds = (_core.PeerLostError, _core.ShutDownError, _core.TransportError,
                 _core.MembershipChangedError, RunEndedError)
        if isinstance(cause, kinds):
            return True
    except ImportError:
        pass
    name = type(cause).__name__
    if name in ("PeerLostError", "ShutDownError", "TransportError", "MembershipChangedError",
                "HorovodInternalError", "RunEndedError"):
        return True
    # torch.distributed's errors around the conflux backend carry the engine's message.
    return bool(re.search(r"suspect rank \d+|CFX_ERR_PEER_LOST|CFX_ERR_SHUT_DOWN|"
                          r"ShutDownError|PeerLostError", str(cause)))


_DIED = tuple(getattr(ray.exceptions, name) for name in
              ("RayActorError", "WorkerCrashedError", "NodeDiedError", "OutOfMemoryError")
              if hasattr(ray.exceptions, name))


def _actor_died(exc):
    """Whether Ray reports the worker's actor (process, node) gone, not an exception of its own."""
    return isinstance(exc, _DIED)


def _first_lines(text, n=3):
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return " ".join(line.strip() for line in lines[:n])


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def died_reason(exc):
    """Ray's account of a dead actor in one line: its first line, and the line saying why
    ("... because it was killed by `ray.kill`", "... because its node died") where there is one."""
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    why = [line for line in lines[1:] if "because" in line]
    return " ".join(lines[:1] + why[:1]) if lines else type(exc).__name__


def _clean_traceback(text):
    """Ray's text of a worker's traceback without its colours and the lines of carets."""
    lines = [line for line in _ANSI.sub("", text).strip().splitlines()
             if line.strip() and set(line.strip()) - set("^~")]
    return "\n".join(lines)


def describe_failure(what, rank, place, exc):
    """One message for a failed worker: `place` is (node id, host name, pid)."""
    node_id, host, pid = place
    where = "rank %d (Ray node %s, host %s, pid %s)" % (rank, _short(node_id), host, pid)
    if _actor_died(exc):
        return ("%s: worker %s died: %s" % (what, where, died_reason(exc)), exc)
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and cause is not None:
        tb = _clean_traceback(str(exc))
        return ("%s: worker %s raised %s: %s\n%s" % (what, where, type(cause).__name__, cause, tb),
                cause)
    return ("%s: worker %s failed: %s: %s" % (what, where, type(exc).__name__, exc), exc)


def gather(refs, places, what, grace_s, on_cause=None, unfinished=None):
    """ray.get of one object ref per rank, in rank order, or WorkerError for the first failure
    that is a cause (a dead actor, an exception of the worker's own) rather than a consequence
    (a peer lost, a world shut down): after the first failure the others get `grace_s` to end.

    on_cause(rank) is called once, when the first cause is seen (the executor marks the run
    ended there). A cause that is an exception is reported once the others have ended too (they
    end at once: the failing worker ended the world), so the run's tasks are all over before the
    next run's start; a dead actor is reported at once (the others end at the transport's
    deadline). (rank, ref) of those still running when it is reported go into `unfinished`."""
    index = {ref: r for r, ref in enumerate(refs)}
    pending = list(refs)
    results, errors = {}, OrderedDict()
    deadline = None
    cause_seen = False
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
        if not ready:
            break
        for ref in ready:
            r = index[ref]
            try:
                results[r] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 (every failure is reported)
                errors[r] = exc
        if not errors:
            continue
        causes = [r for r, e in errors.items() if not _world_lost(e)]
        if causes and not cause_seen:
            cause_seen = True
            if on_cause is not None:
                on_cause(causes[0])
            if any(_actor_died(errors[r]) for r in causes):
                break  # a dead actor: report it now
            deadline = time.monotonic() + grace_s
        elif deadline is None:
            deadline = time.monotonic() + grace_s
    if unfinished is not None:
        unfinished.extend((index[p], p) for p in pending)
    if not errors:
        return [results[r] for r in range(len(refs))]
    causes = [(r, e) for r, e in errors.items() if not _world_lost(e)]
    died = [(r, e) for r, e in causes if _actor_died(e)]
    rank, exc = (died or causes or list(errors.items()))[0]
    message, cause = describe_failure(what, rank, places[rank], exc)
    others = sorted(set(errors) - {rank})
    if others:
        message += "\n(%s also failed: %s)" % (
            "rank" if len(others) == 1 else "ranks",
            "; ".join("rank %d: %s" % (r, _first_lines(getattr(errors[r], "cause", None) or
                                                       errors[r], 1)) for r in others))
    if pending:
        message += "\n(still running: %s)" % ", ".join("rank %d" % index[p] for p in pending)
    raise WorkerError(message, rank, places[rank][0], places[rank][1], places[rank][2], cause,
                      dict(errors))


def driver_address():
    """The address workers reach the driver's store at: CFX_RENDEZVOUS_HOST, else this node's IP
    as Ray knows it."""
    return os.environ.get("CFX_RENDEZVOUS_HOST") or ray.util.get_node_ip_address()


def forwarded_env():
    """The driver's CFX_* variables every worker takes over (CFX_LOG_LEVEL, deadlines, ...), as
    cfxrun forwards them; not the driver's own place in a world."""
    return {k: v for k, v in os.environ.items()
            if k.startswith("CFX_") and k not in _NOT_FORWARDED}


def transport_deadline(env):
    try:
        return float(env.get("CFX_TRANSPORT_TIMEOUT_S") or 30)
    except ValueError:
        return 30.0
