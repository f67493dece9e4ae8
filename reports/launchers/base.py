"""The interface every [launcher] kind implements, and the checks the kinds share.

A kind is one module of this package holding one Launcher subclass (the registry,
reports/launchers/__init__.py, maps its KIND to it). The subclass says:

- which [launcher] keys it takes (KEYS) and parses them (set, finish), and why it refuses the keys of
  other kinds (REFUSED);
- what it allows of a point (check_point) and how its points are shaped (shape_point,
  baseline_settings);
- the command that runs a point (command) and checks a transport on its hosts (check_command);
- the network its rows ran over (network) and the hosts a point occupies (nodes).

Everything else is a query with a safe default here, so a kind overrides only what it changes.
"""

from __future__ import annotations

import abc
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import ClassVar

from reports import settings
from reports.launch import Job

_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Launcher(abc.ABC):
    """A [launcher] table of one kind. The fields here are the keys several kinds share."""

    KIND: ClassVar[str] = ""
    # The [launcher] keys this kind takes, besides kind.
    KEYS: ClassVar[tuple[str, ...]] = ("env", "program")
    # Keys of other kinds this one refuses, each with the reason given.
    REFUSED: ClassVar[dict[str, str]] = {}
    # Whether --hosts and --hostfile on the command line may replace its hosts.
    TAKES_HOST_LIST: ClassVar[bool] = False
    # The program it runs from the bin directory, and what that program is, for messages.
    PROGRAM: ClassVar[str] = "kolo-train"
    PROGRAM_WHAT: ClassVar[str] = "the trainer (kolo-train)"

    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    program: str | None = None  # None: <bin dir>/PROGRAM

    @property
    def kind(self) -> str:
        return self.KIND

    # --- the [launcher] table ---

    def set(self, key: str, value, where: str, root: str, problems: list[str]) -> None:
        """Takes one of KEYS from the table, or adds why its value is not allowed to `problems`.
        `where` names the key for messages; relative paths are taken from `root`."""
        if key == "program":
            if not isinstance(value, str) or not value:
                problems.append(f"{where} must be a non-empty string (a command or a path)")
            else:
                self.program = value
        elif key == "args":
            if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
                problems.append(f"{where} must be an array of strings (extra mpirun arguments)")
            else:
                self.args = list(value)
        elif key == "env":
            if not isinstance(value, dict):
                problems.append(f'{where} must be a table of NAME = "value"')
                return
            for k, v in value.items():
                if not _ENV_RE.match(k) or not isinstance(v, str):
                    problems.append(
                        f"{where}.{k} = {v!r} is not allowed; allowed: a variable name and a string value"
                    )
            self.env = {k: v for k, v in value.items() if isinstance(v, str)}
        else:
            raise KeyError(f"{type(self).__name__} lists {key!r} in KEYS but does not set it")

    def finish(self, table: dict, problems: list[str]) -> None:
        """Checks that need the whole table, once every key is set."""
        return None

    @classmethod
    def elsewhere(cls, key: str, kind: str) -> str:
        """Why `key`, one of this kind's own, is refused under `kind`."""
        return f'[launcher] {key} is allowed only with kind = "{cls.KIND}" (kind is "{kind}")'

    # --- points ---

    def shape_point(self, point: dict, label: str, problems: list[str]) -> dict:
        """The point as this launcher runs it (settings it implies filled in)."""
        return point

    def baseline_settings(self, point: dict) -> dict:
        """Settings of `point` the single-rank baseline made for it keeps, beyond the compute's."""
        return {}

    def check_point(self, point: dict, label: str, root: str, problems: list[str]) -> None:
        """Adds to `problems` what of `point` this launcher cannot run. The default refuses
        placed parameter servers and the settings of predictions and of emulated networks."""
        refuse_ps_hosts(point, label, self.KIND, problems)
        refuse_settings(point, label, self.KIND, settings.SIM_ONLY_SETTINGS, "sim", problems)
        refuse_settings(point, label, self.KIND, settings.CLUSTER_SETTINGS, "cluster", problems)

    # --- running ---

    def program_path(self, bin_dir: str) -> str:
        return self.program or os.path.join(bin_dir, self.PROGRAM)

    def require_tools(self, kolo_run: str) -> None:
        """Raises FileNotFoundError naming what this launcher runs that is missing."""
        return None

    def ready_here(self, sweep, found=None) -> tuple:
        """(the sweep to run on this machine, a note on how it differs or None, the problems
        that stop it). The default runs the sweep as it is."""
        return sweep, None, []

    def shapes(self, points: list[dict]) -> list:
        """The emulated cluster (reports.cluster.Shape) each point needs; None where none."""
        return [None] * len(points)

    def record_on_stdout(self) -> bool:
        """Whether rank 0 may run on another host, so kolo-train also prints its record."""
        return False

    def placement(self, point: dict):
        """Where the point's processes go (reports.placement.Placement), None for the launcher's
        own order."""
        return None

    def trainer_args(self, point: dict, job: Job) -> list[str]:
        """kolo-train's arguments for `point`, with the absolute profile."""
        args = settings.trainer_args(point)
        if job.profile is not None:
            i = args.index("--profile")
            args[i + 1] = job.profile
        return args

    def trainer_argv(self, point: dict, job: Job) -> list[str]:
        """The trainer's whole argv for `point` as every rank runs it."""
        train = [job.program, *self.trainer_args(point, job), "--json", job.json_path]
        if self.record_on_stdout():
            train.append("--json-stdout")
        where = self.placement(point)
        if where is not None:
            train += ["--ps-server-ranks", ",".join(map(str, where.server_ranks))]
        return train

    @abc.abstractmethod
    def command(self, point: dict, job: Job) -> list[str]:
        """The argv that runs `point`."""

    def check_command(self, program: str, transport: str, processes: int) -> list[str] | None:
        """The argv that runs `kolo-train --check-transport` once on every host a point of up to
        `processes` processes may use; None where transports are not checked."""
        return None

    def point_env(self, env: dict[str, str]) -> dict[str, str]:
        """The environment a point's launcher starts with, from the runner's `env`."""
        return {**env, **self.env}

    @abc.abstractmethod
    def network(self) -> str:
        """The CSV's network column for the rows of this launcher (schema.NETWORKS)."""

    def nodes(self, point: dict) -> int:
        """Hosts that `point` occupies."""
        return 1

    def ranks_on_this_host(self) -> bool:
        """Whether the ranks run on the machine the runner runs on (its hardware is theirs)."""
        return self.network() in ("loopback", "emulated")


def require_executable(path: str, what: str) -> None:
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise FileNotFoundError(f"{what} not found or not executable: {path} (build it, or pass --bin-dir)")


def require_command(command: str, key: str) -> None:
    if shutil.which(command) is None:
        raise FileNotFoundError(f"{key} not found: {command!r} ([launcher] {key})")


def refuse_mpi_backend(point: dict, label: str, kind: str, runs: str, problems: list[str]) -> None:
    if point.get("backend") == "mpi":
        problems.append(f'point {label}: backend "mpi" needs mpirun; [launcher] kind = "{kind}" runs {runs}')


def refuse_ps_hosts(point: dict, label: str, kind: str, problems: list[str], why: str = "") -> None:
    """ps_hosts places servers on hosts of their own: only mpirun across hosts and kolo-sim do."""
    if "ps_hosts" in point:
        problems.append(
            f"point {label}: ps_hosts = {point['ps_hosts']!r} places parameter servers on hosts; "
            f'it needs [launcher] kind = "mpirun" with hosts of their own, or kind = "sim" (kind '
            f'is "{kind}"{why})'
        )


# What each kind's own settings are, for refusing them under another kind.
_SETTINGS_OF = {
    "sim": "is a setting of predictions",
    "cluster": "describes an emulated network",
}


def refuse_settings(
    point: dict, label: str, kind: str, names: tuple[str, ...], owner: str, problems: list[str]
) -> None:
    """Refuses the settings `names` that only the kind `owner` takes."""
    for key in names:
        if key in point:
            problems.append(
                f"point {label}: {key} = {point[key]!r} {_SETTINGS_OF[owner]}; it needs "
                f'[launcher] kind = "{owner}" (kind is "{kind}")'
            )
