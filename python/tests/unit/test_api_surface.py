"""The public surface of conflux, conflux.torch and conflux.horovod.torch (every public name, its
kind, signature and docstring) against api_surface.json, so that a change in how the functions
are written cannot change what users see. `python3 test_api_surface.py` prints the surface of the
code as it is now, in the file's format; a deliberate API change rewrites the file with it."""
import importlib
import inspect
import json
import os
import sys

import pytest

EXPECTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api_surface.json")
MODULES = ("conflux", "conflux.torch", "conflux.horovod.torch", "conflux.horovod.torch.elastic")


def public_names(module):
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    return sorted(n for n in dir(module)
                  if not n.startswith("_") and not inspect.ismodule(getattr(module, n)))


def describe(obj):
    """[kind, signature or repr, docstring]."""
    if inspect.isclass(obj) or callable(obj):
        try:
            signature = str(inspect.signature(obj))
        except ValueError:  # builtins without a signature (the SWIG-made exception classes)
            signature = None
        return ["class" if inspect.isclass(obj) else "function", signature, obj.__doc__]
    return ["value", repr(obj), None]


def surface():
    out = {}
    for name in MODULES:
        module = importlib.import_module(name)
        out[name] = {n: describe(getattr(module, n)) for n in public_names(module)}
    return out


@pytest.fixture(scope="module")
def expected():
    pytest.importorskip("torch", reason="python3-torch is not installed")
    with open(EXPECTED, encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("module", MODULES)
def test_public_names_signatures_and_docstrings_are_unchanged(expected, module):
    got = surface()[module]
    want = expected[module]
    assert sorted(got) == sorted(want), "public names differ"
    differ = {n: {"now": got[n], "expected": want[n]} for n in want if got[n] != want[n]}
    assert not differ, json.dumps(differ, indent=1)


def test_the_comparison_sees_a_changed_docstring_and_signature(expected):
    import conflux

    got = describe(conflux.allreduce)
    assert got == expected["conflux"]["allreduce"]

    def allreduce(tensor, op=conflux.Sum, name=None, prescale_factor=1.0, postscale_factor=1.0,
                  compression=conflux.Compression.none):
        pass

    allreduce.__doc__ = conflux.allreduce.__doc__
    assert describe(allreduce) != got  # other default
    allreduce.__defaults__ = (conflux.Average, None, 1.0, 1.0, conflux.Compression.none)
    assert describe(allreduce) == got
    allreduce.__doc__ += " "
    assert describe(allreduce) != got


if __name__ == "__main__":
    json.dump(surface(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
