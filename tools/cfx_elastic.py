#!/usr/bin/python3
"""cfx_elastic - the elastic driver (cfxrun --elastic calls it; docs/elastic.md): horovodrun's
elastic flags and meanings. It serves the job's rendezvous store, starts workers on the hosts it is
given or discovers, reports a worker that died as gone (so the next membership round does not wait
for it), starts workers on hosts the discovery script adds, blacklists a host whose worker failed
(for a cooldown drawn from --blacklist-cooldown-range) and stops its other workers there, so the
host leaves the world whole at the next round (as Horovod's driver does), and ends with one clear
last line when the job cannot go on: fewer than the minimum, every host blacklisted, or the reset
limit reached.

Workers on this machine's names (localhost, 127.0.0.1, its host name) are its child processes;
workers on other hosts are started through the launch agent (OMPI_MCA_plm_rsh_agent or
CFX_RSH_AGENT, as cfxrun --transport gloo does; else ssh), with this process's environment
forwarded as horovodrun forwards it. A remote worker's end is its agent's end (ssh ends with the
command it ran). A host that goes silent (its link down) is found by the survivors' transport
deadline (CFX_TRANSPORT_TIMEOUT_S) and left out by the next membership round; once the job has
finished, the driver stops the workers that are not members of its final world.

The store is the engine's TCP store served for this process (tools/cfx_store.py, the protocol of
capi/src/rendezvous/store_tcp.c), not a file store: hosts share no file system that all clusters
have, and a host whose link is down must lose the store as it loses its peers (a file store on a
shared /tmp would let it go on voting in the rounds). The driver reads the rounds' decisions from
it to know the world.

    cfx_elastic.py -np 4 --min-np 2 --max-np 6 -H localhost:2,127.0.0.1:2 prog args...
    cfx_elastic.py -np 4 --min-np 2 -H a:2,b:2 prog args...
    cfx_elastic.py --min-np 2 --host-discovery-script ./hosts.sh prog args...
"""
import importlib.machinery
import importlib.util
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time


def load_cfxrun():
    """tools/cfxrun as a module: its rendezvous store, and its idea of which hosts are this one."""
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), "cfxrun")
    loader = importlib.machinery.SourceFileLoader("cfxrun", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("cfxrun", loader))
    loader.exec_module(module)
    return module


cfxrun = load_cfxrun()
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
        if a in ("-h", "--help"):
            sys.stdout.write(cfxrun.HELP)  # its --elastic section lists these flags
            sys.exit(0)
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


# Variables not forwarded to a worker on another host: they describe this shell, not the job
# (horovodrun leaves out BASH_FUNC_* and OLDPWD the same way).
NOT_FORWARDED = re.compile(r"BASH_FUNC_.*|OLDPWD|PWD|SHLVL|HOSTNAME|_|SSH_.*|DISPLAY|TERM")
# How long the final world's members get to end once one of them ended well (the transport's
# deadline plus a margin, as cfxrun gives the ranks of a failed job).
FINISH_MARGIN_S = 15.0


def store_host(hosts, discovery, env):
    """The address every worker reaches the store at. The Gloo transport listens on the address a
    worker reached the store from, so a job that may span hosts (a remote host given, or a discovery
    script that may add one) must not use loopback: then this machine's address on the route to
    the first remote host, else on its default route, else its host name's (CFX_RENDEZVOUS_HOST
    overrides)."""
    if env.get("CFX_RENDEZVOUS_HOST") or cfxrun.remote_hosts(hosts):
        return cfxrun.store_address(hosts, env)
    if discovery is None:
        return "127.0.0.1"
    for probe in ("192.0.2.1", socket.gethostname()):  # 192.0.2.1: TEST-NET, never sent to
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                addr = s.getsockname()[0]
            if not addr.startswith("127."):
                return addr
        except OSError:
            continue
    sys.stderr.write("cfx_elastic: this machine has no address but loopback: workers on other "
                     "hosts cannot join (set CFX_RENDEZVOUS_HOST)\n")
    return "127.0.0.1"


def how_it_ended(rc):
    return "signal %d" % -rc if rc < 0 else "status %d" % rc


class Driver:
    def __init__(self, opts):
        self.opts = opts
        try:
            self.store = cfxrun.RendezvousStore(int(os.environ.get("CFX_RENDEZVOUS_PORT", "0") or 0))
        except cfxrun.cfx_store.StoreError as e:
            fail(str(e))
        self.store_addr = "%s:%d" % (store_host(list(opts["hosts"] or {}), opts["discovery"],
                                                os.environ), self.store.port)
        self.workers = {}      # id -> (Popen, host, local rank)
        self.finished = {}     # id -> (exit status, host)
        self.stopped = []      # ids stopped after the job finished (not in its final world)
        self.next_id = 0
        self.resets = 0
        self.blacklist = {}    # host -> time its cooldown ends (inf without a range)
        self.hosts = dict(opts["hosts"] or {})
        self.last_discovery = 0.0
        self.succeeded_at = None
        self.finish_grace = float(os.environ.get("CFX_TRANSPORT_TIMEOUT_S", "30") or 30) + \
            FINISH_MARGIN_S

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

    def on_host(self, host):
        return [w for w in self.workers.values() if w[1] == host]

    def usable(self, now):
        """Free slots per host: its slots, less its live workers, none while blacklisted."""
        free = {}
        for host, slots in self.hosts.items():
            if self.blacklist.get(host, 0) > now:
                continue
            used = len(self.on_host(host))
            if slots > used:
                free[host] = slots - used
        return free

    def worker_env(self, wid, host, local_rank, first_size):
        """The variables a worker gets besides the job's environment."""
        hosts = list(dict.fromkeys(list(self.hosts) + [w[1] for w in self.workers.values()]))
        return {
            "CFX_ELASTIC": "1", "CFX_ELASTIC_ID": str(wid), "CFX_TRANSPORT": "gloo",
            "CFX_RANK": str(wid if wid < first_size else 0), "CFX_SIZE": str(first_size),
            "CFX_RENDEZVOUS_ADDR": self.store_addr, "CFX_RENDEZVOUS_EXTERNAL": "1",
            "CFX_ELASTIC_MIN_SIZE": str(self.opts["min_np"]),
            "CFX_ELASTIC_MAX_SIZE": str(self.opts["max_np"] if self.opts["max_np"] < 1 << 20 else 0),
            "CFX_ELASTIC_TIMEOUT_S": str(self.opts["timeout"]),
            # Horovod's worker environment (the rank and size of the first world; hvd.rank() and
            # hvd.size() give the current ones).
            "HOROVOD_HOSTNAME": host, "HOROVOD_RANK": str(wid), "HOROVOD_SIZE": str(first_size),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(self.hosts.get(host, 1)),
            "HOROVOD_CROSS_RANK": str(hosts.index(host) if host in hosts else len(hosts)),
            "HOROVOD_CROSS_SIZE": str(len(hosts)), "HOROVOD_ELASTIC": "1",
        }

    def start(self, host, first_size):
        wid = self.next_id
        self.next_id += 1
        taken = {w[2] for w in self.on_host(host)}
        local_rank = min(set(range(len(taken) + 1)) - taken)
        env = dict(os.environ)
        env.pop("CFX_RENDEZVOUS_DIR", None)  # the job meets at this driver's store
        env.update(self.worker_env(wid, host, local_rank, first_size))
        if not cfxrun.remote_hosts([host]):
            p = subprocess.Popen(self.opts["command"], env=env)
        else:
            # `exec` all the way: the agent's process is the worker's (ssh's ends with it), so
            # its end is the worker's and stopping it stops the worker.
            forwarded = sorted((k, v) for k, v in env.items()
                               if k.isidentifier() and not NOT_FORWARDED.fullmatch(k))
            remote = "cd %s && exec env %s %s" % (
                shlex.quote(os.getcwd()), " ".join(shlex.quote("%s=%s" % kv) for kv in forwarded),
                shlex.join(self.opts["command"]))
            agent = shlex.split(os.environ.get("OMPI_MCA_plm_rsh_agent") or
                                os.environ.get("CFX_RSH_AGENT") or "ssh")
            p = subprocess.Popen(agent + [host, remote], stdin=subprocess.DEVNULL)
        self.workers[wid] = (p, host, local_rank)

    def mark_gone(self, wid):
        """Tells the membership rounds that `wid` is gone (engine/membership.h: gone/<id>)."""
        self.store.set("elastic/gone/%d" % wid, "1")

    def decisions(self):
        """The rounds' decisions in the store: (round, text) by round. Rounds are decided in order
        (round N + 1 opens only on round N's decision), so they are read from round 1 on until one
        has none."""
        rounds = []
        while True:
            value = self.store.get("elastic/r%d/decision" % (len(rounds) + 1))
            if value is None:
                return rounds
            rounds.append((len(rounds) + 1, value.decode("utf-8", "replace")))

    def final_world(self):
        """The member ids of the newest world the rounds formed (the first world before any)."""
        ids = set(range(self.first))
        for _, text in self.decisions():
            if text.startswith("ok"):
                ids = {int(i) for i in text[2:].split()}
        return ids

    def failed_round(self):
        """A round's failure (fewer than the minimum by its deadline), which ends the job: its
        text, else None. Seen here at once, also while workers on a silent host still run."""
        failed = [text[5:] for _, text in self.decisions() if text.startswith("fail ")]
        return failed[0] if failed else None

    def stop_outsiders(self, now):
        """Once the job finished: a worker outside its final world (left out by a round, on a
        silent host, a newcomer too late) is stopped; the members get the finishing grace."""
        members = self.final_world()
        late = now - self.succeeded_at > self.finish_grace
        for wid, (p, host, _) in list(self.workers.items()):
            if wid not in members or late:
                sys.stderr.write("cfx_elastic: stopping worker id %d on host %s: %s\n" % (
                    wid, host, "the job finished %.0f s ago" % self.finish_grace if late
                    else "the job finished and it is not a member of the final world"))
                p.kill()
                p.wait()
                del self.workers[wid]
                self.stopped.append(wid)

    def end(self, msg, status):
        for p, _, _ in self.workers.values():
            p.kill()
        for p, _, _ in self.workers.values():
            p.wait()
        sys.stderr.write("cfx_elastic: %s\n" % msg)
        sys.stderr.flush()
        sys.exit(status)

    def reap(self, now):
        for wid, (p, host, _) in list(self.workers.items()):
            if wid not in self.workers:
                continue  # stopped with its host (stop_host) in this pass
            rc = p.poll()
            if rc is None:
                continue
            del self.workers[wid]
            self.finished[wid] = (rc, host)
            if rc == 0:
                self.succeeded_at = self.succeeded_at or now
                continue
            self.mark_gone(wid)
            cooldown = random.uniform(*self.opts["cooldown"]) if self.opts["cooldown"] else float("inf")
            self.blacklist[host] = now + cooldown
            # ssh (and the agents that speak for it) ends with 255 when it could not run the
            # command there at all: say so, the worker's own output has nothing.
            agent = " (255: the launch agent could not start it there; is the host reachable?)" \
                if rc == 255 and cfxrun.remote_hosts([host]) else ""
            sys.stderr.write("cfx_elastic: worker id %d on host %s ended with %s%s; host %s "
                             "blacklisted%s\n" % (wid, host, how_it_ended(rc), agent, host,
                                                  "" if self.opts["cooldown"] is None
                                                  else " for %.1f s" % cooldown))
            if self.succeeded_at is None:
                self.resets += 1
            self.stop_host(host, wid)

    def stop_host(self, host, failed):
        """The blacklisted host leaves the world whole, as Horovod's driver has it: its other
        workers are marked gone (the next round does not wait for them) and stopped."""
        for wid, (p, h, _) in sorted(self.workers.items()):
            if h != host:
                continue
            sys.stderr.write("cfx_elastic: stopping worker id %d on host %s: its host is "
                             "blacklisted (worker id %d failed), so it leaves the world with "
                             "it\n" % (wid, host, failed))
            self.mark_gone(wid)
            p.kill()
            p.wait()
            del self.workers[wid]
            self.stopped.append(wid)

    def run(self):
        o = self.opts
        now = time.monotonic()
        self.discover(now)
        free = self.usable(now)
        if sum(free.values()) < o["min_np"]:
            self.end("cannot start: %d slot(s) on hosts %s, fewer than the minimum %d"
                     % (sum(free.values()), sorted(free) or "(none)", o["min_np"]), 1)
        self.first = min(o["np"], sum(free.values()), o["max_np"])
        for host, n in free.items():
            for _ in range(n):
                if self.next_id < self.first:
                    self.start(host, self.first)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, lambda signum, _f: self.end("stopped by %s" % signal.Signals(
                signum).name, 128 + signum))
        while True:
            time.sleep(0.05)
            now = time.monotonic()
            self.reap(now)
            if self.succeeded_at is not None:
                self.stop_outsiders(now)  # the job is finishing: no newcomers
            if not self.workers:
                break
            if self.succeeded_at is not None:
                continue
            if o["reset_limit"] is not None and self.resets > o["reset_limit"]:
                self.end("the reset limit (%d) was reached: %d workers lost" % (o["reset_limit"], self.resets), 1)
            failed = self.failed_round()
            if failed:
                self.end("the job cannot go on: membership %s" % failed, 1)
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
        if self.succeeded_at is None:
            sys.stderr.write("cfx_elastic: every worker failed: %s\n" % ", ".join(
                "id %d on %s (%s)" % (w, h, how_it_ended(rc)) for w, rc, h in failed))
            sys.exit(1)
        sys.stderr.write("cfx_elastic: the job finished (%d worker(s) lost on the way%s)\n" % (
            len(failed), ", %d stopped at the end" % len(self.stopped) if self.stopped else ""))


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    Driver(opts).run()


if __name__ == "__main__":
    main()
