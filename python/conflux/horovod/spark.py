"""Horovod's module name for conflux.spark: `import conflux.horovod.spark` in place of
`import horovod.spark`; `run(fn, args, kwargs, num_proc, start_timeout, ...)` has
horovod.spark.run's signature (docs/spark.md). Horovod's elastic `run_elastic` and its estimators are not provided."""
from ..spark import TaskFailedError, run  # noqa: F401  (re-exported)

__all__ = ["run", "TaskFailedError"]
