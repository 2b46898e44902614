"""No import circle in the package: every module imports on its own, first, in a fresh
interpreter (a circle holds only for the order in which the package happens to import its
modules), and the graph of the package's imports (every import statement, in functions too) has
no cycle. Shared helpers sit in modules that import nothing that imports them (conflux._numpy,
conflux._torch_adapter, conflux._collectives, conflux._torch_collectives, ...); the facades
(conflux, conflux.torch) only re-export, and nothing below them imports them."""
import ast
import os
import pkgutil
import subprocess
import sys

import pytest

import conflux


NATIVE = ("_capi", "_capi_native", "_torch_native", "_torch_c10d", "_jax_ffi")


def _modules():
    """Every module of the package, found on disk without importing any (pkgutil.walk_packages
    imports each package to see inside it, which would load the frameworks the layers wrap into
    this process: TensorFlow and torch's triton cannot share one)."""
    root = os.path.dirname(os.path.abspath(conflux.__file__))
    names = ["conflux"]

    def walk(path, prefix):
        for info in pkgutil.iter_modules([path], prefix):
            if info.name.split(".")[-1] in NATIVE:
                continue  # native code (and SWIG's shim): no package imports of their own
            names.append(info.name)
            if info.ispkg:
                walk(os.path.join(path, info.name.rpartition(".")[2]), info.name + ".")
    walk(root, "conflux.")
    return sorted(names)


MODULES = _modules()
ROOT = os.path.dirname(os.path.abspath(conflux.__file__))


def _path(name):
    base = os.path.join(ROOT, *name.split(".")[1:])
    return os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"


def _imports(name):
    """The package's modules that module `name` imports, anywhere in it."""
    package = name if _path(name).endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(open(_path(name)).read())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("conflux")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = base + ("." + node.module if node.module else "")
            elif (node.module or "").startswith("conflux"):
                base = node.module
            else:
                continue
            for a in node.names:  # a submodule (native ones too), or a name of the module `base`
                sub = base + "." + a.name
                out.add(sub if sub in MODULES or sub.split(".")[-1] in NATIVE else base)
    return {m for m in out if m in MODULES and m != name}


def _cycles(graph):
    """Every cycle of `graph` (module -> the modules it imports) that a depth-first walk meets,
    each as the list of its modules with the first one repeated at its end."""
    cycles, done = [], set()

    def visit(m, path):
        if m in path:
            cycles.append(path[path.index(m):] + [m])
            return
        if m in done:
            return
        for n in sorted(graph.get(m, ())):
            visit(n, path + [m])
        done.add(m)
    for m in sorted(graph):
        visit(m, [])
    return cycles


def test_the_import_graph_has_no_cycle():
    cycles = _cycles({m: _imports(m) for m in MODULES})
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_search_finds_a_circle_added_to_the_package():
    """The package's own graph with one import added that closes a circle (the lowest torch
    module importing the facade that re-exports it, as conflux.torch's optimizer once did), and
    a circle of one module through a lazy import in a function (ast.walk sees those too)."""
    graph = {m: _imports(m) for m in MODULES}
    assert "conflux._torch_collectives" in graph["conflux.torch"]
    graph["conflux._torch_collectives"] = graph["conflux._torch_collectives"] | {"conflux.torch"}
    assert ["conflux._torch_collectives", "conflux.torch", "conflux._torch_collectives"] in \
        _cycles(graph)
    lazy = ast.parse("def f():\n    from . import torch\n")
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(lazy))
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_package_has_its_modules():
    for name in ("conflux._core", "conflux._ops", "conflux._collectives", "conflux.torch",
                 "conflux.torch_process_sets", "conflux.gradset", "conflux.process_sets",
                 "conflux.torch_optimizer", "conflux._torch_collectives",
                 "conflux._torch_compression", "conflux._torch_broadcast",
                 "conflux._torch_optimizer_hooks", "conflux._torch_optimizer_args",
                 "conflux._torch_gradset_optimizer", "conflux._torch_adasum_optimizer",
                 "conflux.horovod.torch.mpi_ops", "conflux.horovod.torch.functions"):
        assert name in MODULES


# The framework layers whose import costs seconds (TensorFlow): their modules import first and
# alone through their package only (one interpreter each, not one per module); their own test
# labels import every module of theirs.
HEAVY_LAYERS = ("conflux.tensorflow", "conflux.keras", "conflux.horovod.tensorflow")


def _first_and_alone():
    return [m for m in MODULES
            if not any(m.startswith(layer + ".") for layer in HEAVY_LAYERS)]


@pytest.mark.parametrize("name", _first_and_alone())
def test_imports_first_and_alone(name):
    code = "import importlib, sys; importlib.import_module(%r); print('ok')" % name
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
