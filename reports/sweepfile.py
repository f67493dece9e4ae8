"""Sweep files: loading, validation of the whole file, and expansion of the matrix into points.

The format is documented in sweeps/README.md. This module reads [sweep], [fixed], [matrix] and
[exclude]; the [launcher] table goes to its kind's module (reports.launchers), which also checks
what of each point it can run. Problems are collected (as SweepError's list) instead of stopping
at the first, so one run names them all.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from reports import files, launchers, settings

TABLES = ("sweep", "launcher", "fixed", "matrix", "exclude")
SWEEP_KEYS = ("name", "description", "timeout_s", "repeats")
DEFAULT_TIMEOUT_S = 600.0
# [sweep] name: a plain file name, nothing a path could be made to leave --out with ("..", "/",
# an absolute path, NUL), nor hidden.
NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
NAME_ALLOWED = 'letters, digits, ".", "_" and "-", not starting with "."'


class SweepError(Exception):
    """A sweep file that cannot be run; `problems` lists every problem found, one line each."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__("\n".join(f"{path}: {p}" for p in problems))


@dataclass
class Sweep:
    path: str
    name: str
    description: str
    timeout_s: float
    repeats: int
    launcher: launchers.Launcher
    points: list[dict]  # normalized settings, each with "repeat" and "point_id"
    axes: list[str] = field(default_factory=list)  # the [matrix] settings, ranks first
    # What the loader added on its own (the single-rank baselines), one line each, for the runner
    # to say.
    added: list[str] = field(default_factory=list)

    def under(self, out_dir: str, *parts: str) -> str:
        """os.path.join(out_dir, *parts), for parts that come from the sweep file (point ids...).
        Raises SweepError when the path would lie outside out_dir. Judged on the normalized path,
        not symlinks: a results folder may well link elsewhere on purpose."""
        path = os.path.join(out_dir, *parts)
        base = os.path.normpath(os.path.abspath(out_dir))
        full = os.path.normpath(os.path.abspath(path))
        if any("\0" in p for p in parts) or os.path.commonpath([base, full]) != base:
            raise SweepError(self.path, [f"path {path!r} would lie outside --out {out_dir}; refused"])
        return path

    def label(self, point: dict) -> str:
        """The point's matrix settings (what sets it apart from the sweep's other points)."""
        text = describe({k: v for k, v in point.items() if k in self.axes or k == "repeat"})
        if is_baseline(point):
            if "backend" not in self.axes:
                text += " backend=none"
            text += " (single-rank baseline, no distribution)"
        return text


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
    points, added = add_baselines(explicit + points, sweep.repeats, sweep.launcher)
    return replace(sweep, points=points, added=added)


BASELINE_SETTINGS = settings.BASELINE_SETTINGS


def is_baseline(point: dict) -> bool:
    """A single-rank point without distributed communication (backend "none")."""
    return point.get("backend") == settings.BASELINE_BACKEND and point.get("ranks") == 1


def baseline_key(point: dict) -> tuple:
    return tuple(point.get(k) for k in BASELINE_SETTINGS)


def add_baselines(
    points: list[dict], repeats: int, launcher: launchers.Launcher | None = None
) -> tuple[list[dict], list[str]]:
    """`points` with, first, a single-rank point without distributed communication (backend
    "none") for every model, batch, compute, precision, dilation and micro-batching among them
    that has none: scaling efficiency's denominator, with what `launcher` keeps of the point it
    was made for (launcher.baseline_settings). Returns the points and one line per baseline added."""
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
        if launcher is not None:
            raw.update(launcher.baseline_settings(p))
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


point_id = settings.point_id


def load(path: str, root: str, hosts: str | None = None, hostfile: str | None = None) -> Sweep:
    """Reads and validates the sweep file at `path`; relative paths in it (profiles, hostfile)
    are taken from the repository root `root`. `hosts` ("node01:8,node02:8") or `hostfile` (a
    path), given on the command line, replace the file's [launcher] hosts and hostfile. Raises
    SweepError listing every problem."""
    try:
        doc = tomllib.loads(files.read_text(path, "sweep file", files.CONFIG_LIMIT))
    except files.NotUtf8 as e:
        bad = f"byte 0x{e.byte:02x} at offset {e.offset}"
        why = f"not valid UTF-8 ({bad}); sweep files must be UTF-8"
        raise SweepError(path, [why]) from None
    except files.FileRefused as e:  # a FIFO, a device, a directory, too large: said in full
        raise SweepError(path, [str(e)]) from None
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
        kind = table.get("kind", launchers.DEFAULT_KIND)
        cls = launchers.KINDS.get(kind) if isinstance(kind, str) else None
        if cls is None or not cls.TAKES_HOST_LIST:
            flag = "--hosts" if hosts is not None else "--hostfile"
            takes = " or ".join(f'"{k}"' for k, c in launchers.KINDS.items() if c.TAKES_HOST_LIST)
            why = f"{flag} replaces the hosts of [launcher] kind = {takes}; this file's kind is {kind!r}"
            raise SweepError(path, [why])
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
    launcher = launchers.parse(doc.get("launcher", {}), root, problems)
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
    points = [_shaped(launcher, p, problems) for p in points]
    for point in points:
        _check_point(point, launcher, root, problems)
    if problems:
        raise SweepError(path, _dedupe(problems))
    axes = sorted(matrix, key=lambda k: k != "ranks")
    given = len(points)
    points, added = add_baselines(points, repeats, launcher)
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


def _shaped(launcher: launchers.Launcher, point: dict, problems: list[str]) -> dict:
    """The point as the launcher runs it, with the id of its settings as shaped."""
    shaped = launcher.shape_point(point, describe(point), problems)
    if shaped is point:
        return point
    shaped["point_id"] = point_id(shaped)
    return shaped


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
                if NAME_RE.fullmatch(value):
                    name = value
                else:
                    problems.append(f"{where} = {value!r} is not allowed; allowed: {NAME_ALLOWED}")
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


def _check_point(point: dict, launcher: launchers.Launcher, root: str, problems: list[str]) -> None:
    """Checks that need a whole point: a replay profile that exists, settings that can run
    together, and what the launcher can run (its check_point)."""
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
    _check_combination(point, label, problems)
    dilation = point.get("dilation", 1)
    if dilation != 1 and point.get("compute") != "replay":
        problems.append(
            f"point {label}: dilation = {dilation} stretches replayed layer times; it needs "
            f'compute = "replay" (compute is {point.get("compute", "left to kolo-train")!r})'
        )
    launcher.check_point(point, label, root, problems)


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


def describe(point: dict) -> str:
    """A short human label of a point: its settings as key=value."""
    return " ".join(
        f"{k}={v}"
        for k, v in point.items()
        if k not in ("point_id", "profile") and not (k == "repeat" and v == 0)
    )
