"""PEP 517 build backend of the conflux Python package (pyproject.toml): CMake builds libconflux and the
SWIG module, and the wheel carries both, conflux/libconflux.so.<ABI> beside conflux/_capi_native*.so,
whose RUNPATH is $ORIGIN. Standard library only (Debian 12 packages no CMake-driven backend), so
`pip install --no-index .` needs nothing from an index (with or without --no-build-isolation: NumPy's
headers come from the interpreter's own site-packages, e.g. Debian's python3-numpy).

The version is the CMake project's (project(Conflux VERSION ...) in CMakeLists.txt); the runtime
dependencies are the lines of tools/python-requirements.txt (the project's one pinned list) tagged
"# runtime" (see runtime_requirements); the other metadata is pyproject.toml's [project] table. Config settings (pip --config-settings KEY=VALUE):
  build-dir   keep the CMake build in this folder (reused by the next build: incremental);
              default: a temporary folder, removed afterwards
  cmake-args  extra CMake arguments, one string ("-DCONFLUX_WITH_CUDA=OFF -DX=Y"), after
              [tool.conflux] cmake-args
CMAKE_BUILD_PARALLEL_LEVEL (environment) bounds the build's parallel jobs.
"""
import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

ROOT = os.path.dirname(os.path.abspath(__file__))
NAME = "conflux"


def _project():
    if tomllib is None:
        raise RuntimeError("conflux_build_backend needs Python >= 3.11 (tomllib) to read pyproject.toml")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def version():
    """The CMake project version: the one place it is written."""
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*Conflux\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not m:
        raise RuntimeError("no project(Conflux VERSION x.y.z) in " + os.path.join(ROOT, "CMakeLists.txt"))
    return m.group(1)


REQUIREMENTS = os.path.join(ROOT, "tools", "python-requirements.txt")
_RUNTIME_TAG = re.compile(r"#\s*runtime(?::\s*(?P<extra>[A-Za-z0-9_-]+))?\s*(?P<spec>[<>=!~][^#]*)?$")


def runtime_requirements(path=REQUIREMENTS):
    """{extra or None: [requirement, ...]} from the pinned list's lines tagged "# runtime" (a
    dependency of the package) or "# runtime: EXTRA" (of that extra), each followed by the range
    the package accepts (the pin is the version tested; the wheel must not force it on a user's
    environment). A tagged line without a range is an error: the range is the package's promise."""
    deps = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            code, sep, comment = line.partition("#")
            if not sep or not code.strip():
                continue
            m = _RUNTIME_TAG.match("#" + comment.strip())
            if not m:
                continue
            name = re.split(r"[=<>!~\[ ]", code.strip(), maxsplit=1)[0]
            if not m.group("spec"):
                raise RuntimeError("%s:%d: '# runtime' on %s needs the range the package accepts, "
                                   "e.g. '# runtime >=1.24'" % (path, lineno, name))
            deps.setdefault(m.group("extra"), []).append(name + m.group("spec").strip().replace(" ", ""))
    return deps


def _metadata():
    p = _project()["project"]
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + version(),
             "Summary: " + p.get("description", "")]
    if "requires-python" in p:
        lines.append("Requires-Python: " + p["requires-python"])
    if "text" in p.get("license", {}):
        lines.append("License: " + p["license"]["text"])
    deps = runtime_requirements()
    lines += ["Requires-Dist: " + d for d in deps.pop(None, [])]
    for extra, reqs in sorted(deps.items()):
        lines.append("Provides-Extra: " + extra)
        lines += ['Requires-Dist: %s; extra == "%s"' % (d, extra) for d in reqs]
    text = "\n".join(lines) + "\n"
    if "readme" in p:
        with open(os.path.join(ROOT, p["readme"]), encoding="utf-8") as f:
            text += "Description-Content-Type: text/markdown\n\n" + f.read()
    return text


def _tag():
    impl = "cp%d%d" % sys.version_info[:2]
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s-%s-%s" % (impl, impl, plat)


def _dist_info():
    return "%s-%s.dist-info" % (NAME, version())


def _write_dist_info(directory):
    d = os.path.join(directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    with open(os.path.join(d, "WHEEL"), "w", encoding="utf-8") as f:
        f.write("Wheel-Version: 1.0\nGenerator: conflux_build_backend\nRoot-Is-Purelib: false\n"
                "Tag: %s\n" % _tag())
    return os.path.basename(d)


# pip's build isolation hides the system's site-packages through these variables; the build needs
# Debian's NumPy headers (there is no index to fetch NumPy from), so CMake runs without them.
_ISOLATION_VARS = ("PYTHONPATH", "PYTHONNOUSERSITE")


def _run(cmd):
    print("conflux_build_backend: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    env = {k: v for k, v in os.environ.items() if k not in _ISOLATION_VARS}
    subprocess.run(cmd, check=True, env=env)


def _cmake_build(build, stage, config_settings):
    """Configures (first time) and builds the Python module, then installs the python and runtime
    components into stage as the wheel lays them out: libconflux in conflux/ beside the module."""
    args = list(_project().get("tool", {}).get("conflux", {}).get("cmake-args", []))
    args += shlex.split((config_settings or {}).get("cmake-args", ""))
    if not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run(["cmake", "-S", ROOT, "-B", build] + gen + [
            "-DPython3_EXECUTABLE=" + sys.executable,
            "-DCONFLUX_WITH_PYTHON=ON",
            "-DCONFLUX_PYTHON_INSTALL_DIR=.",      # <stage>/conflux
            "-DCMAKE_INSTALL_LIBDIR=" + NAME,      # libconflux beside it: the module's RUNPATH is $ORIGIN
        ] + args)
    _run(["cmake", "--build", build, "--target", "cfx_python"])
    shutil.rmtree(stage, ignore_errors=True)
    for component in ("python", "runtime"):
        _run(["cmake", "--install", build, "--prefix", stage, "--component", component])


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _zip_tree(whl, stage, dist_info_dir):
    """Adds stage's files (dist-info included) to the wheel, then its RECORD. A symbolic link becomes a copy of its target (a wheel holds
    no links), and a file reached through a link is not added under its own name as well:
    libconflux.so.1 -> libconflux.so.1.0.0 gives one file, libconflux.so.1 (the SONAME)."""
    files, linked = [], set()
    for dirpath, dirnames, filenames in os.walk(stage):
        dirnames.sort()
        for n in sorted(filenames):
            path = os.path.join(dirpath, n)
            files.append(path)
            if os.path.islink(path):
                linked.add(os.path.realpath(path))
    records = []
    for path in files:
        if not os.path.islink(path) and os.path.realpath(path) in linked:
            continue
        arcname = os.path.relpath(path, stage).replace(os.sep, "/")
        if arcname.endswith(".pyc") or "/__pycache__/" in arcname:
            continue
        with open(path, "rb") as f:
            data = f.read()
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        mode = os.stat(path).st_mode & 0o777
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        whl.writestr(info, data)
        records.append(_record_line(arcname, data))
    record = dist_info_dir + "/RECORD"
    whl.writestr(record, "\n".join(records + [record + ",,"]) + "\n")


# ---- PEP 517 hooks ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_dist_info(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    config_settings = config_settings or {}
    build = config_settings.get("build-dir")
    temporary = build is None
    if temporary:
        build = tempfile.mkdtemp(prefix="conflux-wheel-")
    build = os.path.abspath(build)
    try:
        stage = os.path.join(build, "wheel-root")
        _cmake_build(build, stage, config_settings)
        dist_info = _write_dist_info(stage)
        name = "%s-%s-%s.whl" % (NAME, version(), _tag())
        os.makedirs(wheel_directory, exist_ok=True)
        with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
            _zip_tree(whl, stage, dist_info)
        return name
    finally:
        if temporary:
            shutil.rmtree(build, ignore_errors=True)


def build_sdist(sdist_directory, config_settings=None):
    """The source tree as git tracks it (or, outside a checkout, every file but build folders)."""
    base = "%s-%s" % (NAME, version())
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], check=True, capture_output=True)
        files = [f for f in out.stdout.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if not d.startswith(("build", ".git", "__pycache__"))]
            files += [os.path.relpath(os.path.join(dirpath, n), ROOT) for n in filenames]
    name = base + ".tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files):
            if os.path.lexists(os.path.join(ROOT, f)):
                tar.add(os.path.join(ROOT, f), arcname=base + "/" + f, recursive=False)
        pkg_info = _metadata().encode()
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return name
