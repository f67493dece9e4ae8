"""Command lines for one sweep point, and starting and stopping them without leftovers."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reports import files

if TYPE_CHECKING:
    from reports.launchers import Launcher

# Every process of a point inherits this variable with the point's own token, so that processes
# which left the process group (or were orphaned) are still found and stopped. (On an emulated
# cluster mpirun passes it on to the ranks with -x; the other hosts' daemons start with a clean
# environment, and the cluster's own namespaces tell them apart.)
TOKEN_VAR = "KOLOSWEEP_POINT"
TERM_GRACE_S = 5.0
REAP_BOUND_S = 10.0


@dataclass(frozen=True)
class Job:
    """What starting one point takes besides the point and its launcher: the program (kolo-train;
    kind "sim": kolo-sim), kolo-run, where the record goes, the point's timeout, the replay profile
    (absolute, or None) and, on an emulated cluster, its name and scripts/cluster."""

    program: str
    kolo_run: str
    json_path: str
    timeout_s: float
    profile: str | None
    cluster_name: str | None = None
    cluster_script: str | None = None


def command(
    point: dict,
    launcher: Launcher,
    program: str,
    kolo_run: str,
    json_path: str,
    timeout_s: float,
    profile: str | None,
    cluster_name: str | None = None,
    cluster_script: str | None = None,
) -> list[str]:
    """The argv that runs `point` under `launcher` (reports/launchers/), around `program`
    (kolo-train; kind "sim": kolo-sim); `cluster_name` and `cluster_script` name the emulated
    cluster of kind "cluster"."""
    job = Job(program, kolo_run, json_path, timeout_s, profile, cluster_name, cluster_script)
    return launcher.command(point, job)


def check_command(launcher: Launcher, program: str, transport: str, processes: int) -> list[str] | None:
    """The argv that runs `kolo-train --check-transport` once on every host a point of up to
    `processes` processes may use (exit 0: every host can use `transport`); None where the
    launcher's hosts are not checked."""
    return launcher.check_command(program, transport, processes)


def placement_of(point: dict, launcher: Launcher):
    """Where the point's processes go (reports.placement.Placement) when it places its parameter
    servers (ps_hosts) under mpirun across hosts; None otherwise (the launcher's own order)."""
    return launcher.placement(point)


_libc = None


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the sweep runner is killed outright, the
    # launcher it started gets SIGKILL instead of running on unattended. The runner holds its
    # signals while it starts a point; the launcher must not inherit them held.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    if _libc is not None:
        _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start(argv: list[str], env: dict[str, str], log_path: str, token: str) -> subprocess.Popen:
    """Starts `argv` in a new session (its own process group) with output to `log_path`."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _libc = None
    env = dict(env, **{TOKEN_VAR: token})
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def processes_of(root_pid: int, token: str) -> set[int]:
    """Live processes of a point: `root_pid`'s descendants and any process carrying `token`."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    needle = f"{TOKEN_VAR}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            stat = files.read_bytes(f"/proc/{pid}/stat", "process status", files.PROC_LIMIT)
            # Field 4 (ppid) follows the ")" that ends the command name.
            parents[pid] = int(stat[stat.rindex(b")") + 2 :].split()[1])
            if pid != os.getpid():
                environ = files.read_bytes(f"/proc/{pid}/environ", "process environment", files.PROC_LIMIT)
                if needle in environ.split(b"\0"):
                    found.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        if pid in parents:
            found.add(pid)
        stack.extend(children.get(pid, []))
    return found


def stop(proc: subprocess.Popen, token: str) -> None:
    """Stops every process of a point: SIGTERM to its process group and to each process found by
    processes_of, SIGKILL to what is left after TERM_GRACE_S; reaps the launcher."""
    for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, REAP_BOUND_S)):
        pids = processes_of(proc.pid, token) if proc.poll() is None else processes_of(-1, token)
        if proc.poll() is None:
            _signal_group(proc.pid, sig)
        for pid in pids:
            _signal(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not processes_of(-1, token):
                return
            time.sleep(0.1)
    proc.poll()


def reap_leftovers(token: str) -> int:
    """Kills processes that still carry `token` after the launcher exited; returns how many."""
    pids = processes_of(-1, token)
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    return len(pids)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class Guard:
    """A process that outlives the sweep runner and cleans up after it if it is killed outright
    (SIGKILL, the OOM killer), which leaves it no chance to do so itself. The guard reads a pipe
    from the runner to its end: `release` says "done" first when the runner has cleaned up; if the
    pipe closes without it, the runner died, and the guard runs `argv` (bounded)."""

    def __init__(self, argv: list[str], log_path: str | None = None):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}  # not one of a point's processes
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(log_path or os.devnull, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _GUARD, *argv],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # neither a kill of the runner's group nor a Ctrl-C reaches it
            )

    def release(self, done: bool = True, timeout: float = REAP_BOUND_S) -> None:
        """Closes the pipe, saying "done" first when `done` (else the guard runs its command),
        and reaps the guard, waiting at most `timeout` seconds."""
        with contextlib.suppress(BrokenPipeError):
            if done:
                self.proc.stdin.write(b"done")
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)


# The guard's program: unless told "done" before its stdin closes, it runs its arguments.
_GUARD = (
    "import subprocess, sys\n"
    "if sys.stdin.buffer.read() != b'done':\n"
    "    subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, timeout=300)\n"
)


def point_guard(token: str) -> Guard:
    """A guard that stops every process carrying `token` (a point's) if the runner dies while the
    point runs: its launcher dies with the runner (PR_SET_PDEATHSIG) but leaves the ranks behind,
    orphaned, to run on beside whatever the host does next."""
    return Guard([sys.executable, "-m", "reports.launch", "reap", token])


def _reap_main(token: str) -> int:
    """python -m reports.launch reap TOKEN: kills the token's processes until none is left (a
    launcher's last children may still be starting), for at most REAP_BOUND_S."""
    deadline = time.monotonic() + REAP_BOUND_S
    while reap_leftovers(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    return 0 if not processes_of(-1, token) else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "reap":
        sys.exit(_reap_main(sys.argv[2]))
    sys.exit(f"usage: python -m reports.launch reap TOKEN (got {sys.argv[1:]})")
