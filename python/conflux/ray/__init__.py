"""conflux.ray: Conflux where Ray runs the job (docs/ray.md).

- RayExecutor: Horovod's horovod.ray.RayExecutor (create_settings, start, run, execute,
  run_remote, execute_single, shutdown): workers are Ray actors placed by a placement group,
  meeting over Gloo through a store the driver serves; with min_workers/max_workers it is elastic
  (nodes found from Ray, a lost node shrinks the world, training goes on from the last commit).
- ElasticRayExecutor: Horovod's older elastic executor (create_settings(min_np, max_np, ...),
  start(), run(worker_fn)) on the same driver.
- Ray Train: TorchTrainer(..., torch_config=TorchConfig(backend="conflux")) trains DDP on the
  conflux backend once every Ray worker process registered it; setup_hook is that registration,
  for ray.init(runtime_env={"worker_process_setup_hook": "conflux.ray.setup_hook"}).

`conflux.horovod.ray` is the same under Horovod's module name.
"""
from .runner import RayExecutor, RunEndedError, Settings, WorkerError  # noqa: F401
from .elastic import ElasticRayExecutor, RayHostDiscovery  # noqa: F401

__all__ = ["RayExecutor", "ElasticRayExecutor", "RayHostDiscovery", "RunEndedError", "Settings",
           "WorkerError", "setup_hook"]


def setup_hook():
    """Ray's worker_process_setup_hook for Ray Train on the conflux backend: registers torch's
    backend "conflux" in every worker process of the job that imports torch, before Ray Train's
    TorchConfig calls init_process_group("conflux") there (which it does before the training
    function runs, so importing conflux.torch inside the function is too late):

        ray.init(runtime_env={"worker_process_setup_hook": "conflux.ray.setup_hook"})

    The hook runs in every worker process of the job; it does not import torch itself (a worker
    that never uses torch pays nothing): the registration runs right after the process's own
    `import torch` finished (conflux.ray._torch_hook), or at once where torch is imported
    already."""
    from ._torch_hook import register_after_torch_import
    register_after_torch_import()
