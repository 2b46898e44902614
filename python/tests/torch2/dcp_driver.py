"""A sharded torch.distributed.checkpoint saved on 2 ranks and loaded on 3, on the backend
"conflux" (CMake: python_torch2_dcp_torchrun, python_torch2_dcp_cfxrun).

  dcp_driver.py torchrun|cfxrun [--save-np 2] [--load-np 3] [--timeout 150]

runs dcp_job.py save with --save-np ranks, then dcp_job.py load with --load-np ranks, into one
temporary directory, under the launcher given (torchrun: this interpreter's
torch.distributed.run --standalone; cfxrun: tools/cfxrun, over mpirun). Passes when both jobs
exit 0 and every rank of both printed its PASS line; the last line says PASS or FAIL.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def command(launcher, np, args, timeout):
    job = [os.path.join(HERE, "dcp_job.py")] + args
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", str(np)] + job
    # mpirun's own timeout ends the ranks before ours ends cfxrun
    return [sys.executable, os.path.join(ROOT, "tools", "cfxrun"), "-np", str(np), "--timeout",
            str(max(timeout - 10, 10)), "--", sys.executable] + job


def run(launcher, np, args, timeout):
    cmd = command(launcher, np, args, timeout)
    print("+ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(out)
        return False, "%s job with %d ranks did not end in %d s" % (args[0], np, timeout)
    print(p.stdout, flush=True)
    # Counted, not by line: the ranks share the pipe, so two lines may arrive interleaved.
    passes = len(re.findall(r"PASS: rank \d+ of \d+", p.stdout))
    if p.returncode != 0 or passes != np:
        return False, "%s job with %d ranks: exit status %d, %d of %d ranks passed" % (
            args[0], np, p.returncode, passes, np)
    return True, ""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("launcher", choices=["torchrun", "cfxrun"])
    parser.add_argument("--save-np", type=int, default=2)
    parser.add_argument("--load-np", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=150)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cfx-dcp-") as tmp:
        path = os.path.join(tmp, "checkpoint")
        ok, why = run(a.launcher, a.save_np, ["save", path], a.timeout)
        if ok:
            files = sorted(os.listdir(path)) if os.path.isdir(path) else []
            print("checkpoint files: %s" % files, flush=True)
            if not any(f.endswith(".distcp") for f in files) or ".metadata" not in files:
                ok, why = False, "the save job wrote no checkpoint (%s)" % files
        if ok:
            ok, why = run(a.launcher, a.load_np, ["load", path, str(a.save_np)], a.timeout)
    if ok:
        print("PASS: dcp under %s: saved on %d ranks, loaded on %d" % (
            a.launcher, a.save_np, a.load_np), flush=True)
        return 0
    print("FAIL: dcp under %s: %s" % (a.launcher, why), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
