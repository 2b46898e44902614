#!/usr/bin/python3
"""check-layers: the engine's include rules (docs/architecture.md, "Source layout").

capi/src is one folder per layer. A source file may include headers of its own folder and of
folders on lower layers only, and no two modules (a .c and its .h are one module) may include each
other, directly or through others. Every quoted include names a path from capi/src (or the public
"conflux/conflux.h").

Four rules keep the engine's seams (docs/architecture.md "Writing a transport", "The configuration
path"): no code outside transport/ compares a transport's name (what a transport can do is its
capabilities, cx_transport_caps, and its registry entry); no code outside base/ reads the
environment (every CFX_* variable goes through base/config.c and base/test_hooks.c); no code above
base/ calls a base/ reader of the environment with a NULL lookup (which means "getenv, here and
now": the environment is read once per init into cx_config and handed down, and an entry point
that reads it outside init names the lookup it uses); and no binding (bindings/, python/conflux,
java/src/main, lua/*.lua, beside SRC_DIR's ../..) reads a CFX_* variable itself: it asks the engine
(cfx_features, cfx_transport_name); the launchers in the package (LAUNCHERS: conflux.spark,
conflux.ray) are tools like cfxrun and read their own settings. Comments are not code: they may name any of these.

    check-layers.py [SRC_DIR]      exit 0 when the tree keeps the rules, 1 with one line per breach
    check-layers.py --self-test    proves the check fails on an upward include, a cycle, a
                                   transport name compared, a getenv outside base/, a base/ reader
                                   called with NULL above base/ and a CFX_ variable read in a binding
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
SOURCES = (".c", ".h", ".cu", ".cpp")
# A base/ header's function that takes a lookup of the environment: "name(... cx_*_lookup ...".
READER_DECL = re.compile(r"\b(cx_\w+)\s*\(([^;{)]*\bcx_\w*lookup\b[^;{)]*)\)\s*;")
# A CFX_* variable read by a binding: getenv / os.getenv / System.getenv / os.environ[.get] with
# a literal CFX_ name, or a CFX_ name tested `in os.environ`.
BINDING_ENV = re.compile(r"""(?:getenv|environ(?:\.get)?)\s*[(\[]\s*[rbf]?["']CFX_\w*"""
                         r"""|["']CFX_\w*["']\s+(?:not\s+)?in\s+(?:os\.)?environ""")
BINDING_DIRS = ("bindings", "python/conflux", "java/src/main")

# Launchers inside the package: like tools/cfxrun they start the ranks and serve their store, so
# they read the variables that configure the launcher itself (CFX_RENDEZVOUS_PORT/HOST: where the
# driver serves the store) and set the ones the engine reads; the ranks they start ask the engine.
LAUNCHERS = ("python/conflux/spark.py", "python/conflux/ray/")

BINDING_SOURCES = (".c", ".h", ".cpp", ".i", ".py", ".java", ".lua")
PY_COMMENT = re.compile(r"#[^\n]*|--[^\n]*")


def base_readers(src):
    """{function: index of its lookup argument} for base/ headers' readers of the environment."""
    readers = {}
    base = os.path.join(src, "base")
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else ():
        if not name.endswith(".h"):
            continue
        with open(os.path.join(base, name), encoding="utf-8") as f:
            code = COMMENT.sub(" ", f.read())
        for m in READER_DECL.finditer(code):
            params = [p.strip() for p in m.group(2).split(",")]
            for i, p in enumerate(params):
                if re.search(r"\bcx_\w*lookup\b", p):
                    readers[m.group(1)] = i
    return readers


def call_args(code, start):
    """The top-level arguments of the call whose "(" is at code[start]."""
    depth, args, cur = 0, [], ""
    for ch in code[start:]:
        if ch == "(":
            depth += 1
            if depth == 1:
                continue
        elif ch == ")":
            depth -= 1
            if depth == 0:
                args.append(cur.strip())
                return args
        elif ch == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return args


def check_bindings(root):
    """One line per CFX_* variable a binding reads itself."""
    problems = []
    paths = []
    for d in BINDING_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            paths += [os.path.join(dirpath, f) for f in sorted(files) if f.endswith(BINDING_SOURCES)]
    lua = os.path.join(root, "lua")
    if os.path.isdir(lua):
        paths += [os.path.join(lua, f) for f in sorted(os.listdir(lua)) if f.endswith(".lua")]
    for path in paths:
        if os.path.relpath(path, root).startswith(LAUNCHERS):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        code = (PY_COMMENT if path.endswith((".py", ".lua")) else COMMENT).sub(" ", text)
        for m in BINDING_ENV.finditer(code):
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{os.path.relpath(path, root)}:{line}: a binding reads a CFX_ "
                            "variable itself: ask the engine (cfx_features, cfx_transport_name)")
    return problems


def check(src):
    problems = []
    graph = {}  # module -> modules it includes
    readers = base_readers(src)
    reader_call = re.compile(r"\b(" + "|".join(map(re.escape, readers)) + r")\s*\(") if readers else None
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
            if folder != "base" and reader_call:
                for m in reader_call.finditer(code):
                    args = call_args(code, m.end() - 1)
                    at = readers[m.group(1)]
                    if at < len(args) and args[at] in ("NULL", "0", "nullptr"):
                        problems.append(f"{path}:{line_of(m)}: calls the base/ reader "
                                        f"{m.group(1)} with a NULL lookup (the environment, here "
                                        "and now): take the value from cx_config, read once per "
                                        "init")
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
    reader_decl = ("typedef const char *(*cx_launch_lookup)(const char *, void *);\n"
                   "cfx_status cx_launch_timeouts(cx_launch_lookup lookup, void *user,\n"
                   "                              double *rendezvous_s, double *transport_s);\n")
    reader_ok = tree({"base/launch_env.h": reader_decl,
                      "base/config.c": "st = cx_launch_timeouts(NULL, NULL, &r, &t);\n",
                      "api/a.c": "st = cx_launch_timeouts(cx_config_environment, NULL, &r, &t);\n"})
    reader_null = tree({"base/launch_env.h": reader_decl,
                        "exec/shm_layer.c": "if ((st = cx_launch_timeouts(NULL, NULL, &r,\n"
                                            "                             &t))) return st;\n"})
    cases = [(good, None), (upward, "is not below"), (cycle, "include cycle"),
             (sideways, "is not below"), (stray, "not in a layer folder"),
             (getenv, "reads the environment"), (named, "compares a transport's name"),
             (named_eq, "compares a transport's name"), (reader_ok, None),
             (reader_null, "with a NULL lookup")]
    ok = True
    for src, expect in cases:
        got = check(src)
        shutil.rmtree(src)
        passed = (not got) if expect is None else any(expect in p for p in got)
        print(f"{'ok  ' if passed else 'FAIL'} {expect or 'clean tree'}: {got}")
        ok &= passed
    # The bindings: a tree whose root holds the binding folders.
    binding_cases = [
        ({"python/conflux/ok.py": "# os.environ.get('CFX_X') in a comment\nimport os\n"
                                  "x = os.environ.get('PATH')\n",
          "lua/conflux.lua": "-- os.getenv('CFX_X') in a comment\nlocal p = os.getenv('PATH')\n"},
         None),
        ({"python/conflux/horovod/m.py": "import os\ndef mpi_enabled():\n"
                                         "    return os.environ.get(\"CFX_TRANSPORT\") != 'local'\n"},
         "reads a CFX_ variable"),
        ({"python/conflux/e.py": "import os\nelastic = 'CFX_ELASTIC' in os.environ\n"},
         "reads a CFX_ variable"),
        ({"bindings/python/x.cpp": 'const char *t = getenv("CFX_TRANSPORT");\n'},
         "reads a CFX_ variable"),
        ({"java/src/main/java/C.java": 'String t = System.getenv("CFX_TRANSPORT");\n'},
         "reads a CFX_ variable"),
        ({"lua/conflux.lua": 'local t = os.getenv("CFX_TRANSPORT")\n'}, "reads a CFX_ variable"),
    ]
    for files, expect in binding_cases:
        root = tree(files)
        got = check_bindings(root)
        shutil.rmtree(root)
        passed = (not got) if expect is None else any(expect in p for p in got)
        print(f"{'ok  ' if passed else 'FAIL'} binding: {expect or 'clean bindings'}: {got}")
        ok &= passed
    return 0 if ok else 1


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    src = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "../../capi/src")
    problems = check(os.path.normpath(src))
    problems += check_bindings(os.path.normpath(os.path.join(src, "..", "..")))
    for p in problems:
        print(p)
    print(f"check-layers: {len(problems)} problem(s) in {os.path.normpath(src)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
