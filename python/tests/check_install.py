#!/usr/bin/python3
"""ctest python_install: `cmake --install --component python` into a temporary prefix, with the
built libconflux.so.<ABI> placed in <prefix>/<libdir> as its own install rule would put it (the
whole project's install is tested by tests/install), then import the installed package with a clean
PYTHONPATH (nothing from the build tree) and run a collective at size 1.
Usage: check_install.py BUILD_DIR PACKAGE_DIR LIBCONFLUX_FILE LIBDIR  (dirs relative to the prefix)"""
import os
import shutil
import subprocess
import sys
import tempfile

build, rel, libfile, libdir = sys.argv[1:5]
with tempfile.TemporaryDirectory(prefix="cfx-py-install-") as prefix:
    subprocess.run(["cmake", "--install", build, "--prefix", prefix, "--component", "python"],
                   check=True, stdout=subprocess.DEVNULL)
    os.makedirs(os.path.join(prefix, libdir), exist_ok=True)
    real = os.path.realpath(libfile)
    for name in {os.path.basename(libfile), os.path.basename(real)} | \
            {n for n in os.listdir(os.path.dirname(libfile)) if n.startswith("libconflux.so.")}:
        src = os.path.join(os.path.dirname(libfile), name)
        if os.path.isfile(src):
            shutil.copy2(os.path.realpath(src), os.path.join(prefix, libdir, name))
    site = os.path.join(prefix, rel)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = site
    code = ("import conflux, conflux.torch, conflux.horovod.torch, numpy as np, os, sys\n"
            "assert conflux.__file__.startswith(sys.argv[1]), conflux.__file__\n"
            "conflux.init()\n"
            "assert (conflux.allreduce(np.arange(3.0), op=conflux.Sum) == np.arange(3.0)).all()\n"
            "print('installed conflux', conflux.version(), 'imports from',"
            " os.path.dirname(conflux.__file__))\n")
    res = subprocess.run([sys.executable, "-c", code, site], env=env, cwd="/",
                         capture_output=True, text=True, timeout=120)
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    sys.exit(res.returncode)
