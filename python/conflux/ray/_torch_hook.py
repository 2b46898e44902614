"""Registers torch's backend "conflux" (import conflux.torch) in a process as soon as it has
imported torch: conflux.ray.setup_hook's work, for Ray workers that may never import torch.

A one-shot finder at the front of sys.meta_path answers only for "torch": it lets the other
finders find torch's spec, and has the spec's loader (a fresh object per import, of the usual
type) run `import conflux.torch` after torch's own module code finished. A failure to register
is logged, never raised into the import of torch."""
import importlib.abc
import importlib.util
import logging
import sys

logger = logging.getLogger(__name__)


def _register():
    try:
        import conflux.torch  # noqa: F401  (registers the backend "conflux" and conflux://)
    except Exception as exc:  # noqa: BLE001 (torch must import even if Conflux cannot)
        logger.warning("conflux.ray.setup_hook: torch's backend \"conflux\" is not registered "
                       "in this process: %s", exc)


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self not in sys.meta_path:
            return None
        sys.meta_path.remove(self)  # one shot; and the search below must not find us again
        spec = importlib.util.find_spec("torch")
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_torch = loader.exec_module

        def exec_module(module):
            run_torch(module)
            _register()

        loader.exec_module = exec_module  # this import's loader object only
        return spec


def register_after_torch_import():
    """Registers now if torch is imported, else right after this process imports it."""
    if "torch" in sys.modules:
        _register()
        return
    if not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())
