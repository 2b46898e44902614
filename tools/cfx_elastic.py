#!/usr/bin/python3
"""cfx_elastic - the elastic driver (cfxrun --elastic calls it; docs/elastic.md): horovodrun's
elastic flags and meanings. It keeps the job's rendezvous store (a file store in a directory of
its own, which outlives every worker), starts workers on the hosts it is given or discovers,
reports a worker that died as gone (so the next membership round does not wait for it), starts
workers on hosts the discovery script adds, blacklists a host whose worker failed (for a cooldown
drawn from --blacklist-cooldown-range), and ends with one clear last line when the job cannot go
on: fewer than the minimum, every host blacklisted, or the reset limit reached.

Hosts are names of this machine (localhost, 127.0.0.1, its host name): workers are local
processes; a host of another machine is refused with a clear error.

    cfx_elastic.py -np 4 --min-np 2 --max-np 6 -H localhost:2,127.0.0.1:2 prog args...
    cfx_elastic.py --min-np 2 --host-discovery-script ./hosts.sh prog args...
"""
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

USAGE = ("usage: cfx_elastic.py [-np N] [--min-np N] [--max-np N] [-H host:slots,...] "
         "[--host-discovery-script PATH] [--reset-limit N] [--blacklist-cooldown-range MIN MAX] "
         "[--elastic-timeout S] prog [args...]")
DISCOVERY_PERIOD_S = 1.0


def fail(msg, status=2):
    sys.stderr.write("cfx_elastic: %s\n" % msg)
    sys.exit(status)


def parse_args(argv):
    opts = {"np": None, "min_np": None, "max_np": None, "hosts": None, "discovery": None,
            "reset_limit": None, "cooldown": None, "timeout": 60.0}
    names = {"-np": "np", "--num-proc": "np", "--min-np": "min_np", "--min-num-proc": "min_np",
             "--max-np": "max_np", "--max-num-proc": "max_np", "--reset-limit": "reset_limit"}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if i + 1 >= len(argv):
            fail("%s needs a value\n%s" % (a, USAGE))
        if a in names:
            try:
                opts[names[a]] = int(argv[i + 1])
            except ValueError:
                fail("%s %r: not a number" % (a, argv[i + 1]))
            if opts[names[a]] < (0 if a == "--reset-limit" else 1):
                fail("%s %s: must be at least %d" % (a, argv[i + 1], 0 if a == "--reset-limit" else 1))
        elif a in ("-H", "--hosts"):
            opts["hosts"] = parse_hosts(argv[i + 1].split(","), a)
        elif a == "--host-discovery-script":
            opts["discovery"] = argv[i + 1]
        elif a == "--elastic-timeout":
            opts["timeout"] = float(argv[i + 1])
        elif a == "--blacklist-cooldown-range":
            if i + 2 >= len(argv):
                fail("--blacklist-cooldown-range needs MIN and MAX seconds")
            lo, hi = float(argv[i + 1]), float(argv[i + 2])
            if not 0 <= lo <= hi:
                fail("--blacklist-cooldown-range %s %s: need 0 <= MIN <= MAX" % (argv[i + 1], argv[i + 2]))
            opts["cooldown"] = (lo, hi)
            i += 1
        else:
            fail("unknown option %s\n%s" % (a, USAGE))
        i += 2
    opts["command"] = argv[i:]
    if not opts["command"]:
        fail("no program to run\n%s" % USAGE)
    if opts["hosts"] is None and opts["discovery"] is None:
        opts["hosts"] = {"localhost": opts["np"] or 1}
    if opts["np"] is None:
        opts["np"] = opts["min_np"] or sum((opts["hosts"] or {}).values()) or 1
    opts["min_np"] = opts["min_np"] or opts["np"]
    opts["max_np"] = opts["max_np"] or (opts["np"] if opts["discovery"] is None else 1 << 20)
    if not opts["min_np"] <= opts["np"] <= opts["max_np"]:
        fail("need --min-np (%d) <= -np (%d) <= --max-np (%d)" % (opts["min_np"], opts["np"],
                                                                 opts["max_np"]))
    return opts


def parse_hosts(items, where):
    """horovodrun's host list: "host:slots" (or "host": 1 slot) per item."""
    hosts = {}
    for item in items:
        item = item.strip()
        if not item:
            continue
        name, _, slots = item.partition(":")
        try:
            n = int(slots) if slots else 1
        except ValueError:
            fail("%s: %r is not host:slots" % (where, item))
        if n < 1:
            fail("%s: %r: slots must be at least 1" % (where, item))
        hosts[name] = hosts.get(name, 0) + n
    return hosts


def local_names():
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names


class Driver:
    def __init__(self, opts):
        self.opts = opts
        self.store = tempfile.mkdtemp(prefix="cfx-elastic-store-")
        self.workers = {}      # id -> (Popen, host)
        self.finished = {}     # id -> (exit status, host)
        self.next_id = 0
        self.resets = 0
        self.blacklist = {}    # host -> time its cooldown ends (inf without a range)
        self.hosts = dict(opts["hosts"] or {})
        self.last_discovery = 0.0
        self.succeeded = False

    def discover(self, now):
        if self.opts["discovery"] is None or now - self.last_discovery < DISCOVERY_PERIOD_S:
            return
        self.last_discovery = now
        try:
            out = subprocess.run([self.opts["discovery"]], capture_output=True, text=True,
                                 timeout=30, check=True).stdout
        except (OSError, subprocess.SubprocessError) as e:
            sys.stderr.write("cfx_elastic: host discovery script %s failed: %s\n"
                             % (self.opts["discovery"], e))
            return
        self.hosts = parse_hosts(out.splitlines(), "host discovery script output")

    def usable(self, now):
        """Free slots per host: its slots, less its live workers, none while blacklisted."""
        free = {}
        for host, slots in self.hosts.items():
            if self.blacklist.get(host, 0) > now:
                continue
            used = sum(1 for _, h in self.workers.values() if h == host)
            if slots > used:
                free[host] = slots - used
        return free

    def start(self, host, first_size):
        if host not in local_names():
            fail("host %s is not this machine: this driver starts workers on this machine's names "
                 "only (localhost, 127.0.0.1, %s)" % (host, socket.gethostname()), 1)
        wid = self.next_id
        self.next_id += 1
        local_rank = sum(1 for _, h in self.workers.values() if h == host)
        env = dict(os.environ)
        env.update({
            "CFX_ELASTIC": "1", "CFX_ELASTIC_ID": str(wid), "CFX_TRANSPORT": "gloo",
            "CFX_RANK": str(wid if wid < first_size else 0), "CFX_SIZE": str(first_size),
            "CFX_RENDEZVOUS_DIR": self.store,
            "CFX_ELASTIC_MIN_SIZE": str(self.opts["min_np"]),
            "CFX_ELASTIC_MAX_SIZE": str(self.opts["max_np"] if self.opts["max_np"] < 1 << 20 else 0),
            "CFX_ELASTIC_TIMEOUT_S": str(self.opts["timeout"]),
            # Horovod's worker environment (the rank and size of the first world; hvd.rank() and
            # hvd.size() give the current ones).
            "HOROVOD_HOSTNAME": host, "HOROVOD_RANK": str(wid), "HOROVOD_SIZE": str(first_size),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(self.hosts.get(host, 1)),
            "HOROVOD_ELASTIC": "1",
        })
        p = subprocess.Popen(self.opts["command"], env=env)
        self.workers[wid] = (p, host)

    def mark_gone(self, wid):
        """Tells the membership rounds that `wid` is gone (engine/membership.h: gone/<id>)."""
        path = os.path.join(self.store, "elastic%%2Fgone%%2F%d" % wid)
        with open(path + ".tmp", "w") as f:
            f.write("1")
        os.rename(path + ".tmp", path)

    def end(self, msg, status):
        for p, _ in self.workers.values():
            p.kill()
        for p, _ in self.workers.values():
            p.wait()
        shutil.rmtree(self.store, ignore_errors=True)
        sys.stderr.write("cfx_elastic: %s\n" % msg)
        sys.stderr.flush()
        sys.exit(status)

    def run(self):
        o = self.opts
        now = time.monotonic()
        self.discover(now)
        free = self.usable(now)
        if sum(free.values()) < o["min_np"]:
            self.end("cannot start: %d slot(s) on hosts %s, fewer than the minimum %d"
                     % (sum(free.values()), sorted(free) or "(none)", o["min_np"]), 1)
        first = min(o["np"], sum(free.values()), o["max_np"])
        for host, n in free.items():
            for _ in range(n):
                if self.next_id < first:
                    self.start(host, first)
        self.first = first
        while True:
            time.sleep(0.05)
            now = time.monotonic()
            for wid, (p, host) in list(self.workers.items()):
                rc = p.poll()
                if rc is None:
                    continue
                del self.workers[wid]
                self.finished[wid] = (rc, host)
                if rc == 0:
                    self.succeeded = True
                    continue
                self.mark_gone(wid)
                how = "signal %d" % -rc if rc < 0 else "status %d" % rc
                cooldown = random.uniform(*o["cooldown"]) if o["cooldown"] else float("inf")
                self.blacklist[host] = now + cooldown
                sys.stderr.write("cfx_elastic: worker id %d on host %s ended with %s; host %s "
                                 "blacklisted%s\n" % (wid, host, how, host, "" if o["cooldown"] is None
                                                      else " for %.1f s" % cooldown))
                if not self.succeeded:
                    self.resets += 1
            if not self.workers:
                break
            if o["reset_limit"] is not None and self.resets > o["reset_limit"]:
                self.end("the reset limit (%d) was reached: %d workers lost" % (o["reset_limit"], self.resets), 1)
            if self.succeeded:
                continue  # the job is finishing: no newcomers
            self.discover(now)
            free = self.usable(now)
            if len(self.workers) < o["min_np"] and not free:
                every = all(self.blacklist.get(h, 0) > now for h in self.hosts)
                self.end("%d worker(s) left, fewer than the minimum %d%s" % (
                    len(self.workers), o["min_np"],
                    "; every host is blacklisted" if every and self.hosts else ""), 1)
            for host, n in free.items():
                for _ in range(n):
                    if len(self.workers) < o["max_np"]:
                        self.start(host, self.first)
        failed = sorted((wid, rc, h) for wid, (rc, h) in self.finished.items() if rc != 0)
        shutil.rmtree(self.store, ignore_errors=True)
        if not self.succeeded:
            sys.stderr.write("cfx_elastic: every worker failed: %s\n" % ", ".join(
                "id %d on %s (%s)" % (w, h, "signal %d" % -rc if rc < 0 else "status %d" % rc)
                for w, rc, h in failed))
            sys.exit(1)
        sys.stderr.write("cfx_elastic: the job finished (%d worker(s) lost on the way)\n" % len(failed))


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    Driver(opts).run()


if __name__ == "__main__":
    main()
