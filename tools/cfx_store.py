"""cfx_store - the rendezvous store cfxrun serves (--transport gloo, --elastic): the engine's own TCP
store (capi/src/rendezvous/store_tcp.c), served by the cfx-store tool built from capi's store code
(tools/cfx-store.c), so that there is one store implementation, whoever serves it. cfxrun and
cfx_elastic reach it as RendezvousStore: its port for the ranks, set() and get() for the launcher's
own keys (an elastic job's gone/<id> marks, its rounds' decisions). Python 3 standard library
only."""

import os
import shutil
import subprocess
import threading


class StoreError(Exception):
    """The store cannot be started or served (its message says why)."""


def store_tool():
    """The engine's store, served by a tool built from capi's store code (tools/cfx-store.c):
    CONFLUX_STORE_TOOL names it (the tests' environment does); else the installed one (bin/ of
    the prefix this script is installed under: <prefix>/share/conflux/tools); else on PATH; else
    in a build folder of this source tree."""
    named = os.environ.get("CONFLUX_STORE_TOOL")
    if named:
        return named
    here = os.path.dirname(os.path.realpath(__file__))
    installed = os.path.join(here, "..", "..", "..", "bin", "cfx-store")
    if os.access(installed, os.X_OK):
        return os.path.normpath(installed)
    found = shutil.which("cfx-store")
    if found:
        return found
    root = os.path.dirname(here)
    built = [os.path.join(root, d, "tools", "cfx-store") for d in sorted(os.listdir(root))
             if d.startswith("build")]
    built = [b for b in built if os.access(b, os.X_OK)]
    if built:  # build/ first, else the newest
        return next((b for b in built if os.path.basename(os.path.dirname(os.path.dirname(b)))
                     == "build"), max(built, key=os.path.getmtime))
    raise StoreError("cannot find cfx-store, the rendezvous store cfxrun serves (build Conflux, "
                     "or set CONFLUX_STORE_TOOL to its path)")


class RendezvousStore:
    """The engine's TCP store (capi/src/rendezvous/store_tcp.c: greeting, generation 0 so that it
    serves every world the job forms, then 'S' set, 'C' check, 'G' get), served by cfx-store for
    as long as this object lives; set() and get() reach it through the tool's input."""

    def __init__(self, port=0):
        tool = store_tool()
        try:
            self.proc = subprocess.Popen([tool, str(port)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
        except OSError as e:
            raise StoreError(f"cannot start the rendezvous store {tool}: {e.strerror}") from e
        self.lock = threading.Lock()
        first = self.proc.stdout.readline().decode("utf-8", "replace").strip()
        if not first.startswith("port "):
            self.proc.wait()
            raise StoreError("cannot serve the rendezvous on port %d: %s (set CFX_RENDEZVOUS_PORT "
                             "to a free port)" % (port, first[6:] if first.startswith("error ")
                                                  else "cfx-store ended: " + (first or "no answer")))
        self.port = int(first.split()[1])

    def _ask(self, line):
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().decode("utf-8", "replace").rstrip("\n")
        if answer.startswith("error ") or not answer:
            raise OSError("rendezvous store: " + (answer[6:] or "cfx-store ended"))
        return answer

    def set(self, key, value):
        """Sets `key` (text, no spaces) to `value` (text, one line)."""
        with self.lock:
            self._ask(f"set {key} {value}")

    def get(self, key):
        """The value of `key` as bytes, or None when it is not set."""
        with self.lock:
            head = self._ask(f"get {key}").split()
            if head[0] == "0":
                return None
            value = self.proc.stdout.read(int(head[1]) + 1)
            return value[:-1]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
