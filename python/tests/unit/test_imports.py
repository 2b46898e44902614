"""Every module of the package imports on its own, first, in a fresh interpreter: no module
depends on another having been imported before it, which an import circle would (it holds only
for the order in which the package happens to import its modules)."""
import os
import pkgutil
import subprocess
import sys

import pytest

import conflux


def _modules():
    root = os.path.dirname(os.path.abspath(conflux.__file__))
    names = []
    for info in pkgutil.walk_packages([root], "conflux."):
        if info.name.split(".")[-1] in ("_capi", "_capi_native", "_torch_native"):
            continue  # native code (and SWIG's shim): no package imports of their own
        names.append(info.name)
    return sorted(names)


MODULES = _modules()


def test_the_package_has_its_modules():
    for name in ("conflux._core", "conflux._ops", "conflux._collectives", "conflux.torch",
                 "conflux.torch_process_sets", "conflux.gradset", "conflux.process_sets",
                 "conflux.horovod.torch.mpi_ops", "conflux.horovod.torch.functions"):
        assert name in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_imports_first_and_alone(name):
    code = "import importlib, sys; importlib.import_module(%r); print('ok')" % name
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
