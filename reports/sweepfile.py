"""Sweep files: loading, validation of the whole file, and expansion of the matrix into points.

The format is documented in sweeps/README.md. validate_* functions collect every problem they
find (as SweepError's list) instead of stopping at the first, so one run names them all.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from reports import placement, settings

TABLES = ("sweep", "launcher", "fixed", "matrix", "exclude")
SWEEP_KEYS = ("name", "description", "timeout_s", "repeats")
LAUNCHER_KEYS = (
    "kind",
    "mpirun",
    "args",
    "hosts",
    "hostfile",
    "env",
    "program",
    "fallback",
    "bind_to",
    "srun",
    "partition",
    "tasks_per_node",
    "gpus_per_node",
    "time_limit",
)
LAUNCHER_KINDS = ("mpirun", "local", "cluster", "srun", "sim")
# kind = "local": kolo-run's --bind-to (mpirun takes its own --bind-to in args).
BIND_TO = ("none", "core", "hwthread")
# kind = "srun" only, and the keys only it takes.
SRUN_KEYS = ("srun", "partition", "tasks_per_node", "gpus_per_node", "time_limit")
_TIME_RE = re.compile(r"^([0-9]+-)?[0-9]+(:[0-9]{2}){0,2}$")
# kind = "cluster": what may stand in where scripts/cluster check fails.
FALLBACKS = ("mpirun",)
# Most hosts scripts/cluster makes (its MAX_HOSTS).
CLUSTER_MAX_HOSTS = 16
DEFAULT_TIMEOUT_S = 600.0
_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-]+(:[1-9][0-9]*)?$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


class SweepError(Exception):
    """A sweep file that cannot be run; `problems` lists every problem found, one line each."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__("\n".join(f"{path}: {p}" for p in problems))


@dataclass
class Launcher:
    kind: str = "mpirun"
    mpirun: str = "mpirun"
    args: list[str] = field(default_factory=list)
    hosts: list[tuple[str, int | None]] = field(default_factory=list)  # (host, slots or None)
    hostfile: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    program: str | None = None  # the trainer (kind "sim": kolo-sim); None = <bin dir>/kolo-train
    # kind = "cluster": "mpirun" to run over loopback on this host where no emulated network can
    # be made (scripts/cluster check fails), without the network's settings; None to refuse.
    fallback: str | None = None
    # kind = "local": what kolo-run binds each rank to (BIND_TO); None leaves kolo-run's default.
    bind_to: str | None = None
    # kind = "srun": the command, partition, ranks per node (the GPUs each node trains on), GPUs
    # to ask per node, and the step's time limit (Slurm's format, e.g. "30:00").
    srun: str = "srun"
    partition: str | None = None
    tasks_per_node: int | None = None
    gpus_per_node: int | None = None
    time_limit: str | None = None

    def is_local(self) -> bool:
        """True when every rank runs on this host over loopback (then the loopback flags are
        added). An emulated cluster's ranks are on this machine but not on loopback."""
        if self.kind in ("cluster", "srun", "sim"):
            return False
        if self.kind == "local":
            return True
        if self.hostfile:
            return False
        own = {os.uname().nodename, *LOCAL_HOSTS}
        return all(h in own for h, _ in self.hosts)

    def slots(self) -> list[int | None]:
        """Slots per host in order, from `hosts` or the hostfile; empty for this host alone."""
        if self.hostfile:
            return [slots for _, slots in read_hostfile(self.hostfile)]
        return [slots for _, slots in self.hosts]

    def network(self) -> str:
        """The CSV's network column for the rows of this launcher (schema.NETWORKS)."""
        if self.kind == "cluster":
            return "emulated"
        if self.kind == "sim":
            return "simulated"
        return "loopback" if self.is_local() else "physical"

    def nodes_for(self, processes: int) -> int:
        """Hosts that `processes` ranks occupy when mpirun fills each host's slots in order (under
        srun: the nodes it asks for)."""
        if self.kind == "srun" and self.tasks_per_node:
            return max(1, -(-processes // self.tasks_per_node))
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


@dataclass
class Sweep:
    path: str
    name: str
    description: str
    timeout_s: float
    repeats: int
    launcher: Launcher
    points: list[dict]  # normalized settings, each with "repeat" and "point_id"
    axes: list[str] = field(default_factory=list)  # the [matrix] settings, ranks first
    # What the loader added on its own (the single-rank baselines), one line each, for the runner
    # to say.
    added: list[str] = field(default_factory=list)

    def label(self, point: dict) -> str:
        """The point's matrix settings (what sets it apart from the sweep's other points)."""
        text = describe({k: v for k, v in point.items() if k in self.axes or k == "repeat"})
        if is_baseline(point):
            if "backend" not in self.axes:
                text += " backend=none"
            text += " (single-rank baseline, no distribution)"
        return text


def read_hostfile(path: str) -> list[tuple[str, int | None]]:
    """Open MPI hostfile lines "host [slots=N]"; comments and blank lines skipped."""
    hosts = []
    for line in Path(path).read_text().splitlines():
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


def only(sweep: Sweep, filters: list[str]) -> Sweep:
    """The sweep cut down to the points whose matrix settings match every filter "KEY=V1,V2,..."
    (a point matches when its KEY is one of the values, compared as written in the sweep file).
    Raises SweepError naming the filter when KEY is not an axis of the matrix, when a value is not
    one of the axis's values, or when the filters together leave no point."""
    problems = []
    wanted: dict[str, set[str]] = {}
    for f in filters:
        key, sep, values = f.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            problems.append(f"--only {f!r}: expected KEY=VALUE[,VALUE...]")
            continue
        if key not in sweep.axes:
            allowed = ", ".join(sweep.axes) or "none (the sweep has no [matrix])"
            problems.append(f"--only {f!r}: {key!r} is not a matrix setting; allowed are {allowed}")
            continue
        present = {str(p[key]) for p in sweep.points if key in p}
        values_set = {v.strip() for v in values.split(",") if v.strip()}
        unknown = sorted(values_set - present)
        if unknown:
            problems.append(
                f"--only {f!r}: {key} has no value {', '.join(unknown)}; "
                f"the sweep's are {', '.join(sorted(present))}"
            )
            continue
        wanted.setdefault(key, set()).update(values_set)
    if problems:
        raise SweepError(sweep.path, problems)
    points = [
        p for p in sweep.points if not is_baseline(p) and all(str(p.get(k)) in vs for k, vs in wanted.items())
    ]
    if not points:
        raise SweepError(sweep.path, [f"--only {' --only '.join(filters)} leaves no point to run"])
    # The baselines the remaining points need stay (a filter on backend or ranks would drop them).
    keys = {baseline_key(p) for p in points}
    explicit = [p for p in sweep.points if is_baseline(p) and baseline_key(p) in keys]
    points, added = add_baselines(explicit + points, sweep.repeats, sweep.launcher.kind)
    return replace(sweep, points=points, added=added)


BASELINE_SETTINGS = settings.BASELINE_SETTINGS


def is_baseline(point: dict) -> bool:
    """A single-rank point without distributed communication (backend "none")."""
    return point.get("backend") == settings.BASELINE_BACKEND and point.get("ranks") == 1


def baseline_key(point: dict) -> tuple:
    return tuple(point.get(k) for k in BASELINE_SETTINGS)


def add_baselines(points: list[dict], repeats: int, kind: str = "mpirun") -> tuple[list[dict], list[str]]:
    """`points` with, first, a single-rank point without distributed communication (backend
    "none") for every model, batch, compute, precision, dilation and micro-batching among them
    that has none: scaling efficiency's denominator. Under kind "cluster" it runs on one emulated
    host with the link of the point it was made for (it sends nothing over it). Returns the points
    and one line per baseline added."""
    have = {baseline_key(p) for p in points if is_baseline(p)}
    added: list[dict] = []
    notes: list[str] = []
    for p in points:
        key = baseline_key(p)
        if key in have:
            continue
        have.add(key)
        raw = {k: p[k] for k in (*BASELINE_SETTINGS, "num_warmup_batches", "num_batches") if k in p}
        raw.update(ranks=1, backend="none")
        if kind == "cluster":
            raw.update({k: p[k] for k in ("link", "delay_us") if k in p}, hosts=1, ranks_per_host=1)
        if kind == "sim":
            raw.update({k: p[k] for k in ("link", "calibration") if k in p}, ranks_per_host=1)
        base = settings.normalize(raw)
        for r in range(repeats):
            point = dict(base, repeat=r)
            point["point_id"] = point_id(point)
            added.append(point)
        notes.append(
            "added the single-rank baseline without distribution (scaling efficiency's denominator): "
            + describe({k: v for k, v in base.items() if k in BASELINE_SETTINGS and k != "profile"})
        )
    return added + points, notes


def point_id(point: dict) -> str:
    """A stable id of a point: a hash of its normalized settings and repeat index."""
    key = {k: v for k, v in point.items() if k not in ("point_id",)}
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def load(path: str, root: str, hosts: str | None = None, hostfile: str | None = None) -> Sweep:
    """Reads and validates the sweep file at `path`; relative paths in it (profiles, hostfile)
    are taken from the repository root `root`. `hosts` ("node01:8,node02:8") or `hostfile` (a
    path), given on the command line, replace the file's [launcher] hosts and hostfile. Raises
    SweepError listing every problem."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise SweepError(path, [f"cannot read the file: {e.strerror}"]) from None
    except tomllib.TOMLDecodeError as e:
        raise SweepError(path, [f"not valid TOML: {e}"]) from None
    if hosts is not None and hostfile is not None:
        raise SweepError(path, ["--hosts and --hostfile are both given; give one"])
    if hosts is not None or hostfile is not None:
        table = doc.get("launcher", {})
        if not isinstance(table, dict):
            raise SweepError(path, ["launcher must be a table ([launcher])"])
        kind = table.get("kind", "mpirun")
        if kind != "mpirun":
            flag = "--hosts" if hosts is not None else "--hostfile"
            raise SweepError(
                path,
                [f'{flag} replaces the hosts of [launcher] kind = "mpirun"; this file\'s kind is {kind!r}'],
            )
        table = {k: v for k, v in table.items() if k not in ("hosts", "hostfile")}
        if hosts is not None:
            table["hosts"] = hosts
        else:
            table["hostfile"] = os.path.abspath(hostfile)
        doc = {**doc, "launcher": table}
    return parse(doc, path, root)


def parse(doc: dict, path: str, root: str) -> Sweep:
    """Validates a parsed sweep file and expands its matrix (see load)."""
    problems: list[str] = []
    for key, value in doc.items():
        if key not in TABLES:
            problems.append(f"unknown key {key!r} at the top level; allowed: {_names(TABLES)}")
        elif key == "exclude":
            if not isinstance(value, list):
                problems.append("exclude must be an array of tables ([[exclude]])")
        elif not isinstance(value, dict):
            problems.append(f"{key} must be a table ([{key}])")
    if problems:
        raise SweepError(path, problems)

    name, description, timeout_s, repeats = _parse_sweep(doc.get("sweep", {}), path, problems)
    launcher = _parse_launcher(doc.get("launcher", {}), root, problems)
    fixed = _parse_fixed(doc.get("fixed", {}), problems)
    matrix = _parse_matrix(doc.get("matrix", {}), fixed, problems)
    excludes = _parse_excludes(doc.get("exclude", []), problems)
    for required in ("model", "ranks"):
        if required not in doc.get("fixed", {}) and required not in doc.get("matrix", {}):
            problems.append(f"{required!r} is set nowhere; give it in [fixed] or [matrix]")
    if problems:
        raise SweepError(path, problems)

    points = expand(fixed, matrix, excludes, repeats)
    if not points:
        problems.append("[[exclude]] leaves no point to run")
    if launcher.kind == "cluster":
        points = [_cluster_shape(p, problems) for p in points]
    for point in points:
        _check_point(point, launcher, root, problems)
    if problems:
        raise SweepError(path, _dedupe(problems))
    axes = sorted(matrix, key=lambda k: k != "ranks")
    given = len(points)
    points, added = add_baselines(points, repeats, launcher.kind)
    for point in points[: len(points) - given]:  # the added baselines, checked as the others were
        _check_point(point, launcher, root, problems)
    if problems:
        raise SweepError(path, _dedupe(problems))
    return Sweep(path, name, description, timeout_s, repeats, launcher, points, axes, added)


def expand(fixed: dict, matrix: dict, excludes: list[dict], repeats: int) -> list[dict]:
    """The points of the matrix: the product of its axes (ranks outermost, ascending, so each
    configuration's smallest rank count runs first), with [fixed] added, settings that do not
    apply dropped, excluded points removed and duplicates merged; each point then repeated."""
    axes = list(matrix.items())
    axes.sort(key=lambda kv: kv[0] != "ranks")  # stable: ranks first, the others in file order
    if "ranks" in matrix:
        axes[0] = ("ranks", sorted(matrix["ranks"]))
    names = [k for k, _ in axes]
    seen: set[str] = set()
    points: list[dict] = []
    for combo in itertools.product(*(values for _, values in axes)):
        raw = dict(fixed)
        raw.update(zip(names, combo, strict=True))
        if any(_matches(raw, ex) for ex in excludes):
            continue
        base = settings.normalize(raw)
        if "profile" in base:
            # On a bad placeholder the template stays as it is; _check_point names it.
            with contextlib.suppress(KeyError, IndexError, ValueError):
                base["profile"] = fill_profile(base)
        key = json.dumps(base, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        for r in range(repeats):
            point = dict(base, repeat=r)
            point["point_id"] = point_id(point)
            points.append(point)
    return points


def _cluster_shape(point: dict, problems: list[str]) -> dict:
    """A point of kind "cluster" with its emulated network spelled out: ranks_per_host (default 1),
    hosts (default ranks / ranks_per_host; given, hosts x ranks_per_host must be ranks) and
    delay_us (default 0); link must be given. Problems name the keys and values."""
    label = describe(point)
    out = dict(point)
    rph = out.setdefault("ranks_per_host", 1)
    ranks = out.get("ranks", 0)
    if "link" not in out:
        problems.append(
            f'point {label}: [launcher] kind = "cluster" needs link, the rate of every emulated '
            'host\'s link (e.g. link = "1gbit" in [fixed] or [matrix])'
        )
    if "hosts" in out:
        if out["hosts"] * rph != ranks:
            problems.append(
                f"point {label}: hosts = {out['hosts']} x ranks_per_host = {rph} is "
                f"{out['hosts'] * rph} workers, but ranks = {ranks}; hosts x ranks_per_host must "
                "be ranks (leave hosts out to have it worked out)"
            )
    elif ranks % rph:
        problems.append(
            f"point {label}: ranks = {ranks} is not a multiple of ranks_per_host = {rph}; allowed: "
            "ranks that fill whole hosts"
        )
    else:
        out["hosts"] = ranks // rph
    out.setdefault("delay_us", 0)
    out = dict(settings.normalize(out), repeat=point["repeat"])
    out["point_id"] = point_id(out)
    return out


def cluster_hosts(point: dict) -> int:
    """Emulated hosts a cluster point needs: its workers' hosts, then for backend ps the hosts of
    its servers (ranks_per_host each), which mpirun fills after the workers'."""
    rph = point.get("ranks_per_host", 1)
    servers = settings.process_count(point) - point["ranks"]
    return point.get("hosts", point["ranks"] // rph) + -(-servers // rph)


def on_loopback(sweep: Sweep) -> Sweep:
    """A cluster sweep as [launcher] fallback = "mpirun" runs it where no emulated network can be
    made: every rank on this host over loopback, without the network's settings (hosts,
    ranks_per_host, link, delay_us) or time dilation, which without a slowed network would make
    the communication look faster than it is. Points that become the same are merged."""
    drop = (*settings.CLUSTER_SETTINGS, "dilation")
    launcher = replace(sweep.launcher, kind="mpirun", fallback=None)
    seen: set[str] = set()
    points = []
    for p in sweep.points:
        base = settings.normalize({k: v for k, v in p.items() if k not in drop})
        point = dict(base, repeat=p["repeat"])
        point["point_id"] = point_id(point)
        if point["point_id"] not in seen:
            seen.add(point["point_id"])
            points.append(point)
    axes = [a for a in sweep.axes if a not in drop]
    return replace(sweep, launcher=launcher, points=points, axes=axes)


def fill_profile(point: dict) -> str:
    """The point's profile with {model} and {batch_size} replaced."""
    return point["profile"].format(model=point.get("model", ""), batch_size=point.get("batch_size", ""))


def profile_path(point: dict, root: str) -> str:
    """The point's replay profile, absolute (relative paths are taken from `root`)."""
    text = fill_profile(point)
    return text if os.path.isabs(text) else os.path.join(root, text)


def _matches(point: dict, exclude: dict) -> bool:
    return all(point.get(k) in values for k, values in exclude.items())


def _names(items) -> str:
    return ", ".join(items)


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _parse_sweep(table: dict, path: str, problems: list[str]):
    name = Path(path).stem
    description = ""
    timeout_s = DEFAULT_TIMEOUT_S
    repeats = 1
    for key, value in table.items():
        where = f"[sweep] {key}"
        if key not in SWEEP_KEYS:
            problems.append(f"unknown key {where}; allowed: {_names(SWEEP_KEYS)}")
        elif key in ("name", "description"):
            if not isinstance(value, str):
                problems.append(f"{where} must be a string, not {settings._toml_type(value)}")
            elif key == "name":
                name = value
            else:
                description = value
        elif key == "timeout_s":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                problems.append(f"{where} = {value!r} is not allowed; allowed: a number of seconds > 0")
            else:
                timeout_s = float(value)
        elif key == "repeats":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
                problems.append(f"{where} = {value!r} is not allowed; allowed: an integer 1 to 100")
            else:
                repeats = value
    return name, description, timeout_s, repeats


def _parse_launcher(table: dict, root: str, problems: list[str]) -> Launcher:
    launcher = Launcher()
    for key, value in table.items():
        where = f"[launcher] {key}"
        if key not in LAUNCHER_KEYS:
            problems.append(f"unknown key {where}; allowed: {_names(LAUNCHER_KEYS)}")
        elif key == "kind":
            if value not in LAUNCHER_KINDS:
                kinds = ", ".join(f'"{k}"' for k in LAUNCHER_KINDS)
                problems.append(f"{where} = {value!r} is not allowed; allowed: {kinds}")
            else:
                launcher.kind = value
        elif key == "bind_to":
            if value not in BIND_TO:
                problems.append(
                    f"{where} = {value!r} is not allowed; allowed: " + ", ".join(f'"{b}"' for b in BIND_TO)
                )
            else:
                launcher.bind_to = value
        elif key == "fallback":
            if value not in FALLBACKS:
                problems.append(
                    f"{where} = {value!r} is not allowed; allowed: "
                    + ", ".join(f'"{k}"' for k in FALLBACKS)
                    + " (run over loopback where no emulated network can be made)"
                )
            else:
                launcher.fallback = value
        elif key in ("mpirun", "program"):
            if not isinstance(value, str) or not value:
                problems.append(f"{where} must be a non-empty string (a command or a path)")
            else:
                setattr(launcher, key, value)
        elif key == "args":
            if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
                problems.append(f"{where} must be an array of strings (extra mpirun arguments)")
            else:
                launcher.args = list(value)
        elif key == "hosts":
            launcher.hosts = _parse_hosts(value, where, problems)
        elif key == "hostfile":
            if not isinstance(value, str) or not value:
                problems.append(f"{where} must be a path (a string)")
                continue
            full = value if os.path.isabs(value) else os.path.join(root, value)
            try:
                read_hostfile(full)
                launcher.hostfile = full
            except (OSError, ValueError) as e:
                problems.append(f"{where} = {value!r} cannot be read: {e}")
        elif key in ("srun", "partition", "time_limit"):
            if not isinstance(value, str) or not value:
                problems.append(f"{where} must be a non-empty string")
            elif key == "time_limit" and not _TIME_RE.match(value):
                problems.append(
                    f"{where} = {value!r} is not allowed; allowed: Slurm's time format, "
                    'e.g. "30", "30:00", "2:00:00" or "1-00:00:00"'
                )
            else:
                setattr(launcher, key, value)
        elif key in ("tasks_per_node", "gpus_per_node"):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1024:
                problems.append(f"{where} = {value!r} is not allowed; allowed: an integer in [1, 1024]")
            else:
                setattr(launcher, key, value)
        elif key == "env":
            if not isinstance(value, dict):
                problems.append(f'{where} must be a table of NAME = "value"')
                continue
            for k, v in value.items():
                if not _ENV_RE.match(k) or not isinstance(v, str):
                    problems.append(
                        f"{where}.{k} = {v!r} is not allowed; allowed: a variable name and a string value"
                    )
            launcher.env = {k: v for k, v in value.items() if isinstance(v, str)}
    if launcher.hosts and launcher.hostfile:
        problems.append("[launcher] hosts and hostfile are both set; give one")
    if launcher.kind != "srun":
        for key in SRUN_KEYS:
            if key in table:
                problems.append(
                    f'[launcher] {key} is allowed only with kind = "srun" (kind is "{launcher.kind}")'
                )
    else:
        for key in ("mpirun", "hosts", "hostfile"):
            if key in table:
                problems.append(
                    f'[launcher] {key} is not allowed with kind = "srun" (Slurm chooses the nodes; '
                    "give partition, tasks_per_node and gpus_per_node)"
                )
        if launcher.tasks_per_node is None:
            problems.append('[launcher] kind = "srun" needs tasks_per_node (ranks per node, e.g. 8)')
    if launcher.kind == "local":
        for key in ("mpirun", "args", "hosts", "hostfile"):
            if key in table:
                problems.append(
                    f'[launcher] {key} is not allowed with kind = "local" '
                    '(kolo-run starts every rank on this host); use kind = "mpirun"'
                )
    if launcher.kind == "sim":
        for key in ("mpirun", "args", "hosts", "hostfile", "env"):
            if key in table:
                problems.append(
                    f'[launcher] {key} is not allowed with kind = "sim" (kolo-sim predicts each '
                    "point; nothing is launched on hosts)"
                )
    if launcher.kind == "cluster":
        for key in ("mpirun", "hosts", "hostfile"):
            if key in table:
                problems.append(
                    f'[launcher] {key} is not allowed with kind = "cluster" (scripts/cluster '
                    "runs mpirun inside its first host over its own hosts; give the network as "
                    "the settings hosts, ranks_per_host, link and delay_us)"
                )
    elif "fallback" in table:
        problems.append(
            f'[launcher] fallback is allowed only with kind = "cluster" (kind is "{launcher.kind}")'
        )
    if "bind_to" in table and launcher.kind != "local":
        problems.append(
            f'[launcher] bind_to is allowed only with kind = "local" (kolo-run\'s --bind-to; kind is '
            f'"{launcher.kind}": mpirun takes --bind-to in args)'
        )
    return launcher


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


def _parse_fixed(table: dict, problems: list[str]) -> dict:
    fixed = {}
    for key, value in table.items():
        setting = settings.BY_NAME.get(key)
        if setting is None:
            problems.append(f"unknown setting [fixed] {key}; allowed: {_names(settings.NAMES)}")
            continue
        why = setting.check(value)
        if why:
            problems.append(f"[fixed] {key}: {why}")
        else:
            fixed[key] = value
    return fixed


def _parse_matrix(table: dict, fixed: dict, problems: list[str]) -> dict:
    matrix = {}
    for key, values in table.items():
        setting = settings.BY_NAME.get(key)
        if setting is None:
            problems.append(f"unknown axis [matrix] {key}; allowed: {_names(settings.NAMES)}")
            continue
        if key in fixed:
            problems.append(f"{key} is in both [fixed] and [matrix]; keep one")
            continue
        if not isinstance(values, list) or not values:
            problems.append(f"[matrix] {key} must be a non-empty array of values ({setting.allowed()})")
            continue
        ok = True
        for i, value in enumerate(values):
            why = setting.check(value)
            if why:
                problems.append(f"[matrix] {key}[{i}]: {why}")
                ok = False
        if ok and len(set(values)) != len(values):
            problems.append(f"[matrix] {key} lists a value twice: {values!r}")
            ok = False
        if ok:
            matrix[key] = list(values)
    return matrix


def _parse_excludes(items: list, problems: list[str]) -> list[dict]:
    excludes = []
    for i, item in enumerate(items):
        where = f"[[exclude]] #{i + 1}"
        if not isinstance(item, dict) or not item:
            problems.append(f"{where} must be a non-empty table of setting = value or [values]")
            continue
        ex = {}
        for key, value in item.items():
            setting = settings.BY_NAME.get(key)
            if setting is None:
                problems.append(f"unknown setting {where} {key}; allowed: {_names(settings.NAMES)}")
                continue
            values = value if isinstance(value, list) else [value]
            for v in values:
                why = setting.check(v)
                if why:
                    problems.append(f"{where} {key}: {why}")
            ex[key] = values
        excludes.append(ex)
    return excludes


def _check_point(point: dict, launcher: Launcher, root: str, problems: list[str]) -> None:
    """Checks that need a whole point: a replay profile that exists, a backend the launcher can
    run, enough slots on the hosts."""
    label = describe(point)
    if point.get("compute") == "replay":
        if "profile" not in point:
            problems.append(f'point {label}: compute = "replay" needs a profile (a file path)')
        else:
            try:
                full = profile_path(point, root)
            except (KeyError, IndexError, ValueError) as e:
                problems.append(
                    f"profile {point['profile']!r}: bad placeholder {e}; allowed: {{model}}, {{batch_size}}"
                )
            else:
                if not os.path.isfile(full):
                    problems.append(f"point {label}: profile {full} does not exist")
    if point.get("backend") == "none" and point.get("ranks") != 1:
        problems.append(
            f'point {label}: backend "none" (no distributed communication) runs one rank; '
            f"ranks = {point.get('ranks')} is not allowed, only 1"
        )
    if launcher.kind in ("local", "srun") and point.get("backend") == "mpi":
        runs = "kolo-run" if launcher.kind == "local" else "srun (no Open MPI world)"
        problems.append(
            f'point {label}: backend "mpi" needs mpirun; [launcher] kind = "{launcher.kind}" runs {runs}'
        )
    _check_combination(point, label, problems)
    # ps_hosts under mpirun: the runner builds the point's host list (slots are checked there).
    placed = "ps_hosts" in point and launcher.kind == "mpirun" and not launcher.is_local()
    if "ps_hosts" in point and launcher.kind != "sim":
        if not placed:
            problems.append(
                f"point {label}: ps_hosts = {point['ps_hosts']!r} places parameter servers on hosts; "
                f'it needs [launcher] kind = "mpirun" with hosts of their own, or kind = "sim" (kind '
                f'is "{launcher.kind}"' + (", every host local)" if launcher.kind == "mpirun" else ")")
            )
        else:
            hosts = read_hostfile(launcher.hostfile) if launcher.hostfile else launcher.hosts
            _, why = placement.plan(point, hosts)
            if why is not None:
                problems.append(f"point {label}: ps_hosts = {point['ps_hosts']!r} {why}")
    dilation = point.get("dilation", 1)
    if dilation != 1 and point.get("compute") != "replay":
        problems.append(
            f"point {label}: dilation = {dilation} stretches replayed layer times; it needs "
            f'compute = "replay" (compute is {point.get("compute", "left to kolo-train")!r})'
        )
    if launcher.kind == "sim":
        _check_sim_point(point, label, root, problems)
    else:
        for key in settings.SIM_SETTINGS:
            if key in point:
                problems.append(
                    f"point {label}: {key} = {point[key]!r} is a setting of predictions; it needs "
                    f'[launcher] kind = "sim" (kind is "{launcher.kind}")'
                )
    if launcher.kind not in ("cluster", "sim"):
        for key in settings.CLUSTER_SETTINGS:
            if key in point:
                problems.append(
                    f"point {label}: {key} = {point[key]!r} describes an emulated network; it "
                    f'needs [launcher] kind = "cluster" (kind is "{launcher.kind}")'
                )
    elif "hosts" in point and cluster_hosts(point) > CLUSTER_MAX_HOSTS:
        problems.append(
            f"point {label}: needs {cluster_hosts(point)} emulated hosts (hosts = {point['hosts']}"
            + (" and its parameter servers'" if cluster_hosts(point) > point["hosts"] else "")
            + f"); scripts/cluster makes at most {CLUSTER_MAX_HOSTS}"
        )
    if (
        launcher.kind == "mpirun"
        and not launcher.is_local()
        and not placed
        and "--oversubscribe" not in launcher.args
    ):
        slots = launcher.slots()
        if slots and all(s is not None for s in slots):
            need = settings.process_count(point)
            if need > sum(slots):
                problems.append(
                    f"point {label}: needs {need} processes but the hosts give {sum(slots)} slots; "
                    'add hosts or put "--oversubscribe" in [launcher] args'
                )


def _check_combination(point: dict, label: str, problems: list[str]) -> None:
    """Settings that each are allowed but cannot run together, refused before the first point
    (compute x backend x precision; transport and placement are checked where they apply)."""
    compute = point.get("compute")
    backend = point.get("backend", "ring")
    precision = point.get("precision")
    if compute == "onednn" and precision not in (None, "fp32"):
        problems.append(
            f'point {label}: precision = "{precision}" with compute = "onednn": oneDNN computes in '
            'fp32 only; allowed with onednn: "fp32"'
        )
    if backend == "nccl" and compute != "cudnn":
        problems.append(
            f'point {label}: backend = "nccl" reduces GPU tensors; it needs compute = "cudnn" '
            f"(compute is {compute!r})"
        )


def _check_sim_point(point: dict, label: str, root: str, problems: list[str]) -> None:
    """A point kolo-sim can predict: replay compute (the profile's layer times), whole hosts, no
    emulated-only settings, a calibration file that exists."""
    if point.get("compute") != "replay":
        problems.append(
            f'point {label}: [launcher] kind = "sim" predicts from a replay profile; it needs '
            f'compute = "replay" and a profile (compute is {point.get("compute", "not set")!r})'
        )
    for key in ("hosts", "delay_us"):
        if key in point:
            problems.append(
                f'point {label}: {key} is not allowed with kind = "sim" (hosts are ranks / '
                "ranks_per_host; the simulated links have no added delay)"
            )
    rph = point.get("ranks_per_host", 1)
    if point.get("ranks", 1) % rph:
        problems.append(
            f"point {label}: ranks = {point.get('ranks')} is not a multiple of ranks_per_host = "
            f"{rph}; allowed: ranks that fill whole hosts"
        )
    if "calibration" in point:
        full = (
            point["calibration"]
            if os.path.isabs(point["calibration"])
            else os.path.join(root, point["calibration"])
        )
        if not os.path.isfile(full):
            problems.append(f"point {label}: calibration {full} does not exist")


def describe(point: dict) -> str:
    """A short human label of a point: its settings as key=value."""
    return " ".join(
        f"{k}={v}"
        for k, v in point.items()
        if k not in ("point_id", "profile") and not (k == "repeat" and v == 0)
    )
