#!/usr/bin/python3
"""check-python-imports: the Python package reaches torch through torch's public API.

A module of python/conflux may use torch's private names (a module or attribute path of torch with
a segment that starts with one underscore: torch._C, torch.distributed.distributed_c10d._world,
dist.Backend._plugins ...) only if it is in ALLOWED, the one module that registers the torch
backend; docs/python.md ("torch.distributed's backend") names each private name it uses and why.
Everything else uses torch's documented API, which survives torch's releases.

    check-python-imports.py [PACKAGE_DIR]   exit 0 when the package keeps the rule, 1 with one line
                                            per breach (file:line: the private name)
    check-python-imports.py --self-test     proves the check fails on a private import and a
                                            private attribute path
"""
import ast
import os
import shutil
import sys
import tempfile

ALLOWED = {"torch_backend.py"}
ROOTS = {"torch"}  # the top-level packages whose private names are watched


def _private(path):
    """The first private segment of a dotted torch path, or None."""
    parts = path.split(".")
    if parts[0] not in ROOTS:
        return None
    for p in parts[1:]:
        if p.startswith("_") and not p.startswith("__"):
            return p
    return None


def _dotted(node):
    """'a.b.c' for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def breaches(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    aliases = {}  # local name -> torch path it stands for (import torch.distributed as dist)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _private(a.name):
                    found.append((node.lineno, a.name))
                if a.name.split(".")[0] in ROOTS:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = node.module + "." + a.name
                if _private(full):
                    found.append((node.lineno, full))
                elif node.module.split(".")[0] in ROOTS:
                    aliases[a.asname or a.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            dotted = _dotted(node)
            if not dotted:
                continue
            head, _, rest = dotted.partition(".")
            if head in aliases:
                full = aliases[head] + ("." + rest if rest else "")
                if _private(full):
                    found.append((node.lineno, full))
    return sorted(set(found))


def check(package):
    bad = []
    for folder, _, files in os.walk(package):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, package)
            if rel in ALLOWED:
                continue
            bad += ["%s:%d: torch's private %s (public API only outside %s)"
                    % (rel, line, what, ", ".join(sorted(ALLOWED))) for line, what in breaches(path)]
    return bad


def self_test():
    tmp = tempfile.mkdtemp()
    try:
        cases = {
            "private_import.py": "from torch._C._distributed_c10d import ProcessGroup\n",
            "private_attribute.py": "import torch.distributed as dist\nx = dist.Backend._plugins\n",
            "public.py": "import torch\nimport torch.distributed as dist\nx = dist.Backend.register_backend\n",
        }
        for name, text in cases.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        bad = check(tmp)
        ok = (any(b.startswith("private_import.py:1:") for b in bad)
              and any(b.startswith("private_attribute.py:2:") and "Backend._plugins" in b for b in bad)
              and not any(b.startswith("public.py") for b in bad))
        print("\n".join(bad))
        print("self-test: %s" % ("ok" if ok else "FAILED"))
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp)


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    package = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..",
                                                         "python", "conflux")
    bad = check(package)
    for b in bad:
        print(b)
    print("%d breach(es) in %s" % (len(bad), package) if bad else "python imports: ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
