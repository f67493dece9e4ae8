"""The emulated network of a sweep ([launcher] kind = "cluster"), through scripts/cluster: hosts
that are network namespaces of this machine, each behind a link shaped with tc's tbf.

The runner brings a cluster up for the first point that needs one and keeps it while the next
points fit it: the same ranks per host, link and delay, and no more hosts than it has. Each
cluster is sized for the largest point of the sweep with its ranks per host, link and delay, so a
sweep over rank counts brings one up once; a point with fewer hosts uses the first ones (mpirun
fills the hosts in order) and the others idle. The cluster is brought down when the network must
change, at the end of the sweep, when a point fails and on interrupt; a guard process, started
first, brings it down if the runner itself is killed outright. Nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass

from reports import launch, settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "cluster")
# Most hosts scripts/cluster makes (its MAX_HOSTS).
MAX_HOSTS = 16
CHECK_TIMEOUT_S = 60.0
UP_TIMEOUT_S = 180.0
DOWN_TIMEOUT_S = 120.0
# How long the processes a point started in the cluster's hosts may take to end after its
# launcher exits, before they count as left behind and are killed.
LEFTOVER_GRACE_S = 3.0


@dataclass(frozen=True)
class Shape:
    """An emulated cluster: hosts, ranks per host, link rate, one-way delay and the per-flow cap
    of kolo's TCP connections ("" for none)."""

    hosts: int
    ranks_per_host: int
    link: str
    delay_us: int = 0
    flow_cap: str = ""

    def network(self) -> tuple[int, str, int, str]:
        """What a point needs the same of: ranks per host, link, delay and flow cap."""
        return (self.ranks_per_host, self.link, self.delay_us, self.flow_cap)

    def fits(self, need: Shape) -> bool:
        """Whether a point needing `need` can run on this cluster (mpirun fills hosts in order)."""
        return self.network() == need.network() and self.hosts >= need.hosts

    def up_argv(self, name: str, script: str = SCRIPT) -> list[str]:
        argv = [script, "up", "--name", name, "--hosts", str(self.hosts)]
        argv += ["--ranks-per-host", str(self.ranks_per_host), "--link", self.link]
        if self.delay_us:
            argv += ["--delay-us", str(self.delay_us)]
        if self.flow_cap:
            argv += ["--flow-cap", self.flow_cap]
        return argv

    def describe(self) -> str:
        delay = f", {self.delay_us} µs one-way delay" if self.delay_us else ""
        cap = f", kolo's TCP flows capped at {self.flow_cap} each (emulated)" if self.flow_cap else ""
        return f"{self.hosts} host(s) x {self.ranks_per_host} rank(s), {self.link} links{delay}{cap}"


def cluster_hosts(point: dict) -> int:
    """Emulated hosts a cluster point needs: its workers' hosts, then for backend ps the hosts of
    its servers (ranks_per_host each), which mpirun fills after the workers'."""
    rph = point.get("ranks_per_host", 1)
    servers = settings.process_count(point) - point["ranks"]
    return point.get("hosts", point["ranks"] // rph) + -(-servers // rph)


def needed(point: dict) -> Shape:
    """The smallest cluster `point` runs on (cluster_hosts: its workers' hosts and, for backend
    ps, its servers')."""
    hosts = cluster_hosts(point)
    cap = point.get("flow_cap", "")
    return Shape(
        hosts,
        point.get("ranks_per_host", 1),
        point["link"],
        point.get("delay_us", 0),
        "" if cap == "off" else cap,
    )


def plan(points: list[dict]) -> list[Shape]:
    """The cluster each point runs on: for its ranks per host, link and delay, as many hosts as
    the largest point with the same needs, so that one cluster serves them all."""
    needs = [needed(p) for p in points]
    most: dict[tuple, int] = {}
    for n in needs:
        most[n.network()] = max(most.get(n.network(), 0), n.hosts)
    return [Shape(most[n.network()], *n.network()) for n in needs]


@dataclass
class Check:
    ok: bool
    text: str  # what scripts/cluster check said (why not, when not ok)
    netem: bool  # whether delays can be emulated (scripts/cluster up --delay-us)


def check(script: str = SCRIPT) -> Check:
    """Whether this machine can host an emulated cluster: `scripts/cluster check`."""
    if not (os.path.isfile(script) and os.access(script, os.X_OK)):
        return Check(False, f"{script} is missing or not executable", False)
    try:
        done = subprocess.run(
            [script, "check"],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Check(False, f"{script} check did not answer within {CHECK_TIMEOUT_S:g} s", False)
    except OSError as e:
        return Check(False, f"{script} check could not run: {e}", False)
    text = " ".join((done.stdout + " " + done.stderr).split())
    return Check(done.returncode == 0, text or f"exit status {done.returncode}", "netem: yes" in text)


def new_name() -> str:
    """A cluster name of its own for one sweep run (scripts/cluster: a lowercase letter, then up
    to 15 lowercase letters or digits)."""
    return "sw" + secrets.token_hex(3)


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


class Session:
    """The cluster of one sweep run: `ensure` before each point, `close` at the end (a context
    manager). Every scripts/cluster command and its output goes to `log_path` and to the point's
    log."""

    def __init__(self, log_path: str, name: str | None = None, script: str = SCRIPT):
        self.name = name or new_name()
        self.script = script
        self.log_path = log_path
        self.current: Shape | None = None
        # An up was started and no down has finished since: something of the cluster may exist.
        self._may_exist = False
        self._guard: launch.Guard | None = None

    def __enter__(self) -> Session:
        # Brings the cluster down if the runner is killed outright.
        self._guard = launch.Guard([self.script, "down", "--name", self.name], self.log_path)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, argv: list[str], timeout: float, point_log: str | None) -> tuple[int, str]:
        """Runs a scripts/cluster command; returns its exit status and output, both logged."""
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
            rc, out = done.returncode, (done.stdout + done.stderr)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc, out = 124, out + f"\ntimed out after {timeout:g} s"
        text = "$ " + " ".join(argv) + "\n" + out + ("" if out.endswith("\n") else "\n")
        for path in (self.log_path, point_log):
            if path:
                with open(path, "a") as f:
                    f.write(text)
        return rc, out

    def ensure(self, shape: Shape, point_log: str | None = None) -> str | None:
        """Makes the cluster `shape` the running one, keeping the running cluster when it is the
        same shape. Returns None, or why it could not be brought up."""
        if self.current == shape:
            if point_log:
                with open(point_log, "a") as f:
                    f.write(f"# on cluster {self.name} ({shape.describe()}), up since an earlier point\n")
            return None
        self.down(point_log)
        self._may_exist = True
        rc, out = self._run(shape.up_argv(self.name, self.script), UP_TIMEOUT_S, point_log)
        if rc != 0:
            self.down(point_log)  # whatever a failed or stopped up left
            return f"scripts/cluster up failed (exit status {rc}): {_tail(out)}"
        self.current = shape
        return None

    def down(self, point_log: str | None = None) -> bool:
        """Brings the running cluster down (scripts/cluster down, which stops its processes);
        True when nothing of it is left."""
        if not self._may_exist:
            return True
        self.current = None
        rc, _ = self._run([self.script, "down", "--name", self.name], DOWN_TIMEOUT_S, point_log)
        if rc == 0:
            self._may_exist = False
        return rc == 0

    def close(self) -> None:
        """Brings the cluster down and releases the guard (which brings it down itself if this
        does not finish)."""
        ok = self.down()
        if self._guard is not None:
            self._guard.release(done=ok, timeout=DOWN_TIMEOUT_S + 10)
            self._guard = None

    def namespace_pids(self) -> set[int]:
        """Processes running in the cluster's hosts (namespaces NAME-h0..: scripts/cluster's
        layout) now."""
        if self.current is None:
            return set()
        pids: set[int] = set()
        for i in range(self.current.hosts):
            try:
                done = subprocess.run(
                    ["ip", "netns", "pids", f"{self.name}-h{i}"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    stdin=subprocess.DEVNULL,
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            pids.update(int(w) for w in done.stdout.split() if w.isdigit())
        return pids

    def reap_leftovers(self) -> int:
        """Kills the processes still running in the cluster's hosts once LEFTOVER_GRACE_S has
        passed (a point's launcher has exited: whatever runs there is its leftover); returns how
        many."""
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        pids = self.namespace_pids()
        while pids and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = self.namespace_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)
