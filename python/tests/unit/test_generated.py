"""conflux._collectives and the generated part of conflux.horovod.torch.mpi_ops are what
tools/gen-python-collectives writes from conflux._ops.OPS: the checked-in code and the table
cannot drift apart. The generator runs with --check in a fresh interpreter, on the package this
suite imports (PYTHONPATH), and fails with the difference."""
import os
import subprocess
import sys

import conflux

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GENERATOR = os.path.join(ROOT, "tools", "gen-python-collectives")


def test_generated_collectives_are_up_to_date():
    built = os.path.dirname(os.path.dirname(os.path.abspath(conflux.__file__)))
    env = dict(os.environ, PYTHONPATH=built, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, GENERATOR, "--check"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_collectives_are_ordinary_functions():
    """`def allreduce` is in a file: inspect finds its source, and it names the module it is in."""
    import inspect
    import conflux._collectives as generated
    source = inspect.getsource(conflux.allreduce)
    assert source.lstrip().startswith("def allreduce(tensor, op=")
    assert inspect.getsourcefile(conflux.allreduce) == inspect.getsourcefile(generated)
    assert conflux.allreduce.__module__ == "conflux" and conflux.allreduce.__qualname__ == "allreduce"
