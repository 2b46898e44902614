#!/usr/bin/python3
"""check-layers: the engine's include rules (docs/architecture.md, "Source layout").

capi/src is one folder per layer. A source file may include headers of its own folder and of
folders on lower layers only, and no two modules (a .c and its .h are one module) may include each
other, directly or through others. Every quoted include names a path from capi/src (or the public
"conflux/conflux.h").

Two rules keep the engine's seams (docs/architecture.md "Writing a transport", "The configuration
path"): no code outside transport/ compares a transport's name (what a transport can do is its
capabilities, cx_transport_caps), and no code outside base/ reads the environment (every CFX_*
variable goes through base/config.c and base/test_hooks.c). Comments are not code: they may name
either.

    check-layers.py [SRC_DIR]      exit 0 when the tree keeps the rules, 1 with one line per breach
    check-layers.py --self-test    proves the check fails on an upward include, a cycle, a
                                   transport name compared and a getenv outside base/
"""
import os
import shutil
import re
import sys
import tempfile

# Lowest first. Folders on one layer do not include each other.
LAYERS = [
    ("base",),                # errors, logging, dtypes, string map, configuration
    ("observe", "kernels", "rendezvous"),  # timeline, autotune; reduction kernels; rendezvous stores
    ("transport", "cuda"),    # how bytes move between ranks; CUDA kernels and NCCL
    ("protocol",),            # wire codec, handles, queue, cache, negotiation, fusion plan
    ("exec",),                # the collective engine and its data paths
    ("engine",),              # the context and its background loop
    ("api",),                 # the public entry points
]
RANK = {folder: i for i, layer in enumerate(LAYERS) for folder in layer}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
PUBLIC = {"conflux/conflux.h"}
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
GETENV = re.compile(r"\b(?:secure_)?getenv\s*\(")
# A transport's name in a comparison: strcmp/strncmp/strcasecmp with ops->name among the
# arguments, or ops->name on either side of == / !=.
NAME_COMPARED = re.compile(r"\bstr(?:n?case)?n?cmp\s*\([^;]*?\bops\s*->\s*name\b"
                           r"|\bops\s*->\s*name\s*[=!]="
                           r"|[=!]=\s*[\w.>-]*\bops\s*->\s*name\b")
SOURCES = (".c", ".h", ".cu")


def check(src):
    problems = []
    graph = {}  # module -> modules it includes
    for dirpath, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith(SOURCES):
                continue
            path = os.path.relpath(os.path.join(dirpath, name), src)
            folder = path.split(os.sep)[0] if os.sep in path else ""
            if folder not in RANK:
                problems.append(f"{path}: not in a layer folder ({', '.join(RANK)})")
                continue
            module = os.path.splitext(path)[0]
            deps = graph.setdefault(module, set())
            with open(os.path.join(src, path), encoding="utf-8") as f:
                text = f.read()
            code = COMMENT.sub(" ", text)
            line_of = lambda m: code.count("\n", 0, m.start()) + 1
            if folder != "base":
                for m in GETENV.finditer(code):
                    problems.append(f"{path}:{line_of(m)}: reads the environment (getenv) outside "
                                    "base/: read the variable in base/config.c or base/test_hooks.c")
            if folder != "transport":
                for m in NAME_COMPARED.finditer(code):
                    problems.append(f"{path}:{line_of(m)}: compares a transport's name: ask its "
                                    "capabilities (cx_transport_caps, transport/transport.h)")
            for inc in INCLUDE.findall(text):
                if inc in PUBLIC:
                    continue
                if not os.path.isfile(os.path.join(src, inc)):
                    problems.append(f"{path}: includes \"{inc}\", which is not a path under capi/src")
                    continue
                target = inc.split("/")[0] if "/" in inc else ""
                if target not in RANK:
                    problems.append(f"{path}: includes \"{inc}\" outside the layer folders")
                    continue
                if target != folder and RANK[target] >= RANK[folder]:
                    problems.append(f"{path}: includes \"{inc}\": {target}/ is not below {folder}/")
                dep = os.path.splitext(inc)[0]
                if dep != module:
                    deps.add(dep)
    problems += [f"include cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph):
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def self_test():
    def tree(files):
        d = tempfile.mkdtemp(prefix="cfx-layers-")
        for path, text in files.items():
            os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(d, path), "w", encoding="utf-8") as f:
                f.write(text)
        return d

    good = tree({"base/a.h": "", "base/a.c": '#include "base/a.h"\nconst char *v = getenv("CFX_A");\n',
                 "exec/x.c": '#include "base/a.h"\n#include "conflux/conflux.h"\n'
                             '/* not strcmp(t->ops->name, "mpi"), nor getenv("X") */\n'
                             'int f(cx_transport *t) { return t->ops->caps.prefers_host_shm; }\n'
                             'const char *n(cx_transport *t) { return t->ops->name; }\n',
                 "transport/t.c": 'int same(cx_transport *t) { return !strcmp(t->ops->name, "mpi"); }\n'})
    getenv = tree({"exec/p.c": 'static long size(void) { return atol(getenv("CFX_POOL")); }\n'})
    named = tree({"engine/c.c": 'bool mpi = strcmp(t->ops->name, "mpi") == 0;\n'})
    named_eq = tree({"exec/e.c": 'if (x->transport->ops->name == mpi_name) return 1;\n'})
    upward = tree({"base/a.c": '#include "exec/x.h"\n', "exec/x.h": ""})
    cycle = tree({"exec/x.h": '#include "exec/y.h"\n', "exec/y.c": '#include "exec/x.h"\n',
                  "exec/y.h": ""})
    sideways = tree({"observe/t.c": '#include "kernels/r.h"\n', "kernels/r.h": ""})
    stray = tree({"loose.c": ""})
    cases = [(good, None), (upward, "is not below"), (cycle, "include cycle"),
             (sideways, "is not below"), (stray, "not in a layer folder"),
             (getenv, "reads the environment"), (named, "compares a transport's name"),
             (named_eq, "compares a transport's name")]
    ok = True
    for src, expect in cases:
        got = check(src)
        shutil.rmtree(src)
        passed = (not got) if expect is None else any(expect in p for p in got)
        print(f"{'ok  ' if passed else 'FAIL'} {expect or 'clean tree'}: {got}")
        ok &= passed
    return 0 if ok else 1


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    src = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "../../capi/src")
    problems = check(os.path.normpath(src))
    for p in problems:
        print(p)
    print(f"check-layers: {len(problems)} problem(s) in {os.path.normpath(src)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
