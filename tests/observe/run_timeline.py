#!/usr/bin/python3
"""Driver of the timeline tests under mpirun (registered by tests/observe/CMakeLists.txt).

    run_timeline.py MPIEXEC NP PROGRAM TSV OUTDIR run|kill

run:  a NP-rank job with CFX_TIMELINE=OUTDIR/tl.json; every per-rank file must load with
      tools/cfx-timeline's loader, have its closing bracket, every phase of every tensor, a
      "ready" mark for every rank on every tensor (rank 0's file), and STEPS submissions; the
      tool must find the STEPS steps, and its picture (OUTDIR/steps.png) must show the files'
      intervals (test_picture.py FILE...).
kill: the same job, rank 0 SIGKILLs itself after the steps: mpirun fails, and every file must
      still load (no closing bracket) with every phase of every tensor.
tune: CFX_AUTOTUNE=1 with short windows over enough steps to settle: every sum stays right while
      the parameters change (so every rank planned alike), and OUTDIR/tune.csv shows each parameter
      taking several values, then one "settled" row."""
import glob
import os
import shutil
import subprocess
import sys

import tlcheck  # this folder: the tool and how the tests run it

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 4
# The tuner settles after 13 candidates x (1 warm-up + 3 measured) windows of 0.05 s: 2.6 s of
# traffic. 300 steps of the ResNet-50 set took 2.6 s on a quiet, fast host (50 of the 52 windows),
# so the job runs twice that.
TUNE_STEPS = 600


def tune(mpiexec, np, prog, tsv, outdir, env):
    csv_path = os.path.join(outdir, "tune.csv")
    env = dict(env, CFX_AUTOTUNE="1", CFX_AUTOTUNE_WINDOW_S="0.05", CFX_AUTOTUNE_LOG=csv_path,
               CFX_LOG_LEVEL="info")
    del env["CFX_TIMELINE"]
    cmd = [mpiexec, "-n", str(np), "--timeout", "150", prog, "run", str(TUNE_STEPS), tsv]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    settled_log = [l for l in p.stdout.splitlines() if "autotune info] settled" in l]
    if p.returncode != 0:
        print(p.stdout[-4000:])
        print("run_timeline: the autotuned job failed (%d)" % p.returncode)
        return 1
    rows = [l.strip().split(",") for l in open(csv_path)][1:]
    bad = []
    for col, name in ((2, "fusion_threshold"), (3, "chunk_bytes"), (4, "cycle_time_ms")):
        values = sorted({r[col] for r in rows})
        print("run_timeline: %s took %s" % (name, values))
        if len(values) < 3:
            bad.append("%s took only %s" % (name, values))
    settled = [r for r in rows if r[-1] == "settled"]
    if len(settled) != 1:
        bad.append("%d settled rows" % len(settled))
    if len(settled_log) != 1:
        bad.append("rank 0 logged %d 'settled' lines" % len(settled_log))
    else:
        print("run_timeline: " + settled_log[0])
    for b in bad:
        print("run_timeline: " + b)
    return 1 if bad else 0


def main():
    mpiexec, np, prog, tsv, outdir, mode = sys.argv[1:7]
    np = int(np)
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    env = dict(os.environ, CFX_TIMELINE=os.path.join(outdir, "tl.json"), CFX_TIMELINE_MARK_CYCLES="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_hwloc_base_binding_policy="none")
    if mode == "tune":
        return tune(mpiexec, np, prog, tsv, outdir, env)
    cmd = [mpiexec, "-n", str(np), "--timeout", "120", prog, mode, str(STEPS), tsv]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if mode == "run" and p.returncode != 0:
        print(p.stdout)
        print("run_timeline: the job failed (%d)" % p.returncode)
        return 1
    if mode == "kill" and p.returncode == 0:
        print(p.stdout)
        print("run_timeline: the job was meant to die of SIGKILL")
        return 1
    files = sorted(glob.glob(os.path.join(outdir, "tl.rank*.json")))
    if len(files) != np:
        print("run_timeline: files %s, expected %d" % (files, np))
        return 1
    if mode == "kill":
        for f in files:
            with open(f, "rb") as fh:
                if fh.read().rstrip().endswith(b"]"):
                    print("run_timeline: %s has its closing bracket after SIGKILL" % f)
                    return 1
    ntensors = sum(1 for l in open(tsv) if l.strip() and not l.startswith("#"))
    check = [sys.executable, os.path.join(HERE, "tlcheck.py"), "--ranks", str(np),
             "--tensors", str(ntensors)]
    if mode == "run":
        check += ["--occurrences", str(np * STEPS)]
    else:
        check += ["--allow-open", "--min-occurrences", str(np)]
    r = subprocess.run(check + files)
    if r.returncode != 0:
        return r.returncode
    tool = tlcheck.COMMAND
    if mode == "kill":  # the summary works on the files of a killed job
        return subprocess.run(tool + ["--top", "3", "--merge", os.path.join(outdir, "merged.json")]
                              + files).returncode
    p = subprocess.run(tool + ["--top", "3", "--png", os.path.join(outdir, "steps.png"),
                        "--merge", os.path.join(outdir, "merged.json")] + files,
                       stdout=subprocess.PIPE, text=True)
    print(p.stdout)
    if p.returncode != 0:
        return p.returncode
    want = "steps: %d, found from the tensor set that repeats most: %d tensor(s)" % (STEPS,
                                                                                     ntensors)
    if want not in p.stdout:
        print("run_timeline: the summary does not say %r" % want)
        return 1
    picture = os.path.join(HERE, "test_picture.py")
    return subprocess.run([sys.executable, picture] + files).returncode


if __name__ == "__main__":
    sys.exit(main())
