"""One Ray cluster of two nodes on this machine for every Ray test of the session (Ray's own
multi-node test cluster, ray.cluster_utils.Cluster: a head node and a second node, each its own
raylet with 2 CPUs, no dashboard, a small object store), started and stopped here.

Every process the cluster starts inherits CFX_RAY_TEST_SESSION (a token of this session); at the
end, after Ray's own shutdown, any such process still alive (Ray Train leaves a detached
PlacementGroupCleaner actor behind when the cluster goes away under it) is ended by its pid."""
import os
import signal
import sys
import uuid

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_CPUS = 2
OBJECT_STORE = 80 * 1024 * 1024


def _leftovers(token):
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if b"CFX_RAY_TEST_SESSION=" + token.encode() in f.read().split(b"\0"):
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


class RayCluster:
    """The session's cluster: `cluster` (ray.cluster_utils.Cluster), `second` (the second node's
    handle, for the tests that remove it), add_node() / remove_node()."""

    def __init__(self):
        self.token = uuid.uuid4().hex
        os.environ["CFX_RAY_TEST_SESSION"] = self.token
        # The workers import ray_jobs (the functions the tests send by reference).
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        sys.path.insert(0, HERE)
        # A lost peer (a killed actor, a removed node) is found within this deadline.
        os.environ.setdefault("CFX_TRANSPORT_TIMEOUT_S", "10")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=NODE_CPUS, include_dashboard=False, object_store_memory=OBJECT_STORE))
        self.second = self.add_node()
        ray.init(address=self.cluster.address,
                 runtime_env={"worker_process_setup_hook": "conflux.ray.setup_hook"})
        self.cluster.wait_for_nodes()

    def add_node(self):
        return self.cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE)

    def remove_node(self, node):
        self.cluster.remove_node(node)

    def node_ids(self):
        return sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))

    def close(self):
        try:
            ray.shutdown()
        finally:
            self.cluster.shutdown()
            for pid in _leftovers(self.token):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture(scope="session")
def ray_cluster():
    c = RayCluster()
    try:
        yield c
    finally:
        c.close()
