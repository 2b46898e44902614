"""horovod.ray's API on Conflux: `from conflux.horovod.ray import RayExecutor` in place of
`from horovod.ray import RayExecutor` (conflux.ray; docs/ray.md)."""
from ..ray import (ElasticRayExecutor, RayExecutor, RayHostDiscovery, Settings,  # noqa: F401
                   WorkerError)

__all__ = ["RayExecutor", "ElasticRayExecutor", "RayHostDiscovery", "Settings", "WorkerError"]
