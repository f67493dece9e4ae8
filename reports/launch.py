"""Command lines for one sweep point, and starting and stopping them without leftovers."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

from reports import placement, settings, sweepfile
from reports.sweepfile import Launcher

# mpirun flags for ranks on this host over loopback TCP (the same as scripts/lib.sh's).
LOOPBACK_MPIRUN_ARGS = (
    "--oversubscribe",
    "--allow-run-as-root",
    "--mca",
    "btl",
    "self,tcp",
    "--mca",
    "btl_tcp_if_include",
    "lo",
    "--mca",
    "oob_tcp_if_include",
    "lo",
    "--bind-to",
    "none",
)
# mpirun flags for ranks on an emulated cluster (scripts/cluster mpirun adds its own for the
# cluster's subnet): no binding, since every emulated host's daemon would bind its ranks to the
# same first cores of this machine.
CLUSTER_MPIRUN_ARGS = ("--bind-to", "none")
# Every process of a point inherits this variable with the point's own token, so that processes
# which left the process group (or were orphaned) are still found and stopped. (On an emulated
# cluster mpirun passes it on to the ranks with -x; the other hosts' daemons start with a clean
# environment, and the cluster's own namespaces tell them apart.)
TOKEN_VAR = "KOLOSWEEP_POINT"
TERM_GRACE_S = 5.0
REAP_BOUND_S = 10.0


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
    """The argv that runs `point`: mpirun, kolo-run, srun, or scripts/cluster mpirun on the
    emulated cluster `cluster_name` (kind "cluster"), around `program` (kolo-train). Where rank 0
    may run on another host (mpirun across hosts, srun) kolo-train also prints its record on
    stdout, so that the runner needs no shared filesystem."""
    args = settings.trainer_args(point)
    if profile is not None:
        i = args.index("--profile")
        args[i + 1] = profile
    train = [program, *args, "--json", json_path]
    if launcher.kind == "srun" or (launcher.kind == "mpirun" and not launcher.is_local()):
        # Rank 0 may run on another host: the record comes back with the output as well.
        train.append("--json-stdout")
    where = placement_of(point, launcher)
    if where is not None:
        train += ["--ps-server-ranks", ",".join(map(str, where.server_ranks))]
    np_ = str(settings.process_count(point))
    if launcher.kind == "srun":
        processes = settings.process_count(point)
        argv = [launcher.srun, "--ntasks", np_, "--nodes", str(launcher.nodes_for(processes))]
        argv += ["--ntasks-per-node", str(min(launcher.tasks_per_node or processes, processes))]
        argv += ["--distribution", "block", "--kill-on-bad-exit=1", "--export", "ALL"]
        if launcher.partition:
            argv += ["--partition", launcher.partition]
        if launcher.gpus_per_node:
            argv += ["--gpus-per-node", str(launcher.gpus_per_node)]
        if launcher.time_limit:
            argv += ["--time", launcher.time_limit]
        return argv + launcher.args + train
    if launcher.kind == "local":
        argv = [kolo_run, "-np", np_, "--timeout-s", str(int(timeout_s) + 1)]
        if launcher.bind_to:
            argv += ["--bind-to", launcher.bind_to]
        return argv + ["--", *train]
    if launcher.kind == "sim":
        return sim_command(point, program, args, json_path)
    if launcher.kind == "cluster":
        if cluster_name is None or cluster_script is None:
            raise ValueError('kind "cluster" needs the cluster\'s name and scripts/cluster')
        argv = [cluster_script, "mpirun", "--name", cluster_name]
        argv += ["--ranks-per-host", str(point.get("ranks_per_host", 1)), "--", "-np", np_]
        argv += [*CLUSTER_MPIRUN_ARGS, "-x", TOKEN_VAR]
        for name, value in launcher.env.items():
            argv += ["-x", f"{name}={value}"]
        return argv + launcher.args + train
    argv = [launcher.mpirun, "-np", np_]
    if launcher.is_local():
        argv += list(LOOPBACK_MPIRUN_ARGS)
    if where is not None:
        argv += ["-H", where.host_arg()]
        if "--map-by" not in launcher.args:
            argv += ["--map-by", "slot"]
    elif launcher.hosts:
        argv += ["-H", ",".join(h if s is None else f"{h}:{s}" for h, s in launcher.hosts)]
    elif launcher.hostfile:
        argv += ["--hostfile", launcher.hostfile]
    for name, value in launcher.env.items():
        argv += ["-x", f"{name}={value}"]
    return argv + launcher.args + train


def check_command(launcher: Launcher, program: str, transport: str, processes: int) -> list[str]:
    """The argv that runs `kolo-train --check-transport` once on every host a point of up to
    `processes` processes may use (exit 0: every host can use `transport`)."""
    check = [program, "--check-transport", "--transport", transport]
    if launcher.kind == "srun":
        nodes = str(launcher.nodes_for(processes))
        return [
            launcher.srun,
            "--nodes",
            nodes,
            "--ntasks",
            nodes,
            "--ntasks-per-node",
            "1",
            "--kill-on-bad-exit=0",
            "--export",
            "ALL",
            *launcher.args,
            *check,
        ]
    if launcher.kind == "local" or launcher.is_local():
        return check
    hosts = sweepfile.read_hostfile(launcher.hostfile) if launcher.hostfile else launcher.hosts
    argv = [launcher.mpirun, "-np", str(len(hosts)), "-H", ",".join(f"{h}:1" for h, _ in hosts)]
    for name, value in launcher.env.items():
        argv += ["-x", f"{name}={value}"]
    return argv + launcher.args + check


def placement_of(point: dict, launcher: Launcher) -> placement.Placement | None:
    """Where the point's processes go when it places its parameter servers (ps_hosts) under
    mpirun across hosts; None otherwise (mpirun's own order, servers last)."""
    if "ps_hosts" not in point or launcher.kind != "mpirun" or launcher.is_local():
        return None
    hosts = sweepfile.read_hostfile(launcher.hostfile) if launcher.hostfile else launcher.hosts
    where, why = placement.plan(point, hosts)
    if where is None:
        raise ValueError(f"ps_hosts: {why}")  # the sweep file's validation refuses this first
    return where


def sim_command(point: dict, program: str, trainer_args: list[str], json_path: str) -> list[str]:
    """kolo-sim predict with kolo-train's arguments for `point` and the prediction's own settings
    (calibration taken from the repository root when relative)."""
    argv = [program, "predict", *trainer_args, "--ranks", str(point["ranks"])]
    argv += ["--ranks-per-host", str(point.get("ranks_per_host", 1))]
    if "link" in point:
        argv += ["--link", point["link"]]
    if "calibration" in point:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        cal = point["calibration"]
        argv += ["--calibration", cal if os.path.isabs(cal) else os.path.join(root, cal)]
    if "gpu_rate" in point:
        argv += ["--gpu-rate", f"{point['gpu_rate']:g}"]
    if "step_jitter" in point:
        argv += ["--step-jitter", f"{point['step_jitter']:g}"]
    if "allreduce" in point:
        argv += ["--allreduce", point["allreduce"]]
    if "ps_hosts" in point:
        argv += ["--ps-hosts", point["ps_hosts"]]
    return argv + ["--json", json_path]


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
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            # Field 4 (ppid) follows the ")" that ends the command name.
            parents[pid] = int(stat[stat.rindex(b")") + 2 :].split()[1])
            if pid != os.getpid():
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
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
