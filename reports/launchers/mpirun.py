"""[launcher] kind = "mpirun": Open MPI's mpirun, on this host over loopback or across the hosts
given (hosts, a hostfile, or --hosts/--hostfile on the command line)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from reports import files, placement, settings
from reports.launchers import base

# mpirun flags for ranks on this host over loopback TCP. scripts/lib.sh keeps a copy as
# KOLO_MPIRUN_ARGS for the shell scripts; tests/python/test_launchers.py checks that they agree.
LOOPBACK_ARGS = (
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
)
# Ranks that share one machine's cores are not bound to them (added after LOOPBACK_ARGS, and on an
# emulated cluster, where every host's daemon would bind its ranks to the same first cores).
NO_BINDING = ("--bind-to", "none")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-]+(:[1-9][0-9]*)?$")


def read_hostfile(path: str) -> list[tuple[str, int | None]]:
    """Open MPI hostfile lines "host [slots=N]"; comments and blank lines skipped."""
    hosts = []
    for line in files.read_text(path, "hostfile", files.CONFIG_LIMIT).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        slots = None
        for w in words[1:]:
            if w.startswith("slots="):
                slots = int(w.split("=", 1)[1])
        hosts.append((words[0], slots))
    return hosts


@dataclass
class MpirunLauncher(base.Launcher):
    KIND = "mpirun"
    KEYS = ("mpirun", "args", "hosts", "hostfile", "env", "program")
    TAKES_HOST_LIST = True

    mpirun: str = "mpirun"
    hosts: list[tuple[str, int | None]] = field(default_factory=list)  # (host, slots or None)
    hostfile: str | None = None

    def set(self, key, value, where, root, problems):
        if key == "mpirun":
            if not isinstance(value, str) or not value:
                problems.append(f"{where} must be a non-empty string (a command or a path)")
            else:
                self.mpirun = value
        elif key == "hosts":
            self.hosts = _parse_hosts(value, where, problems)
        elif key == "hostfile":
            if not isinstance(value, str) or not value:
                problems.append(f"{where} must be a path (a string)")
                return
            full = value if os.path.isabs(value) else os.path.join(root, value)
            try:
                read_hostfile(full)
                self.hostfile = full
            except (OSError, ValueError) as e:
                problems.append(f"{where} = {value!r} cannot be read: {e}")
        else:
            super().set(key, value, where, root, problems)

    def finish(self, table, problems):
        if self.hosts and self.hostfile:
            problems.append("[launcher] hosts and hostfile are both set; give one")

    def host_list(self) -> list[tuple[str, int | None]]:
        """(host, slots or None) in order, from `hosts` or the hostfile; empty for this host alone."""
        return read_hostfile(self.hostfile) if self.hostfile else self.hosts

    def is_local(self) -> bool:
        """True when every rank runs on this host over loopback (then the loopback flags are added)."""
        if self.hostfile:
            return False
        own = {os.uname().nodename, *LOCAL_HOSTS}
        return all(h in own for h, _ in self.hosts)

    def slots(self) -> list[int | None]:
        """Slots per host in order; empty for this host alone."""
        return [slots for _, slots in self.host_list()]

    def network(self) -> str:
        return "loopback" if self.is_local() else "physical"

    def nodes_for(self, processes: int) -> int:
        """Hosts that `processes` ranks occupy when mpirun fills each host's slots in order."""
        slots = self.slots()
        if not slots or any(s is None for s in slots):
            return max(1, min(len(slots), processes)) if slots else 1
        used, nodes = 0, 0
        for s in slots:
            if used >= processes:
                break
            used += s
            nodes += 1
        return max(nodes, 1)

    def nodes(self, point):
        return self.nodes_for(settings.process_count(point))

    def record_on_stdout(self):
        return not self.is_local()

    def placement(self, point):
        """Where the point's processes go when it places its parameter servers (ps_hosts) across
        hosts; None otherwise (mpirun's own order, servers last)."""
        if "ps_hosts" not in point or self.is_local():
            return None
        where, why = placement.plan(point, self.host_list())
        if where is None:
            raise ValueError(f"ps_hosts: {why}")  # the sweep file's validation refuses this first
        return where

    def check_point(self, point, label, root, problems):
        # ps_hosts: the runner builds the point's host list (slots are checked there).
        placed = "ps_hosts" in point and not self.is_local()
        if "ps_hosts" in point:
            if not placed:
                base.refuse_ps_hosts(point, label, self.KIND, problems, ", every host local")
            else:
                _, why = placement.plan(point, self.host_list())
                if why is not None:
                    problems.append(f"point {label}: ps_hosts = {point['ps_hosts']!r} {why}")
        base.refuse_settings(point, label, self.KIND, settings.SIM_ONLY_SETTINGS, "sim", problems)
        base.refuse_settings(point, label, self.KIND, settings.CLUSTER_SETTINGS, "cluster", problems)
        if not self.is_local() and not placed and "--oversubscribe" not in self.args:
            slots = self.slots()
            if slots and all(s is not None for s in slots):
                need = settings.process_count(point)
                if need > sum(slots):
                    problems.append(
                        f"point {label}: needs {need} processes but the hosts give {sum(slots)} slots; "
                        'add hosts or put "--oversubscribe" in [launcher] args'
                    )

    def command(self, point, job):
        argv = [self.mpirun, "-np", str(settings.process_count(point))]
        if self.is_local():
            argv += [*LOOPBACK_ARGS, *NO_BINDING]
        where = self.placement(point)
        if where is not None:
            argv += ["-H", where.host_arg()]
            if "--map-by" not in self.args:
                argv += ["--map-by", "slot"]
        elif self.hosts:
            argv += ["-H", ",".join(h if s is None else f"{h}:{s}" for h, s in self.hosts)]
        elif self.hostfile:
            argv += ["--hostfile", self.hostfile]
        return argv + exported(self.env) + self.args + self.trainer_argv(point, job)

    def check_command(self, program, transport, processes):
        check = [program, "--check-transport", "--transport", transport]
        if self.is_local():
            return check
        hosts = self.host_list()
        argv = [self.mpirun, "-np", str(len(hosts)), "-H", ",".join(f"{h}:1" for h, _ in hosts)]
        return argv + exported(self.env) + self.args + check

    def require_tools(self, kolo_run):
        base.require_command(self.mpirun, "mpirun")


def exported(env: dict[str, str]) -> list[str]:
    """mpirun's -x for each variable, so that ranks on other hosts get it too."""
    argv = []
    for name, value in env.items():
        argv += ["-x", f"{name}={value}"]
    return argv


def _parse_hosts(value, where: str, problems: list[str]) -> list[tuple[str, int | None]]:
    if not isinstance(value, str) or not value.strip():
        problems.append(f'{where} must be a string like "host1:8,host2:8"')
        return []
    hosts = []
    for item in value.split(","):
        item = item.strip()
        if not _HOST_RE.match(item):
            problems.append(f"{where}: {item!r} is not allowed; allowed: host or host:slots (slots >= 1)")
            continue
        host, _, slots = item.partition(":")
        hosts.append((host, int(slots) if slots else None))
    return hosts
