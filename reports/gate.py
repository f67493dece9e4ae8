"""The regression gate: a sweep's scaling, judged on what a loaded host cannot move.

Three kinds of check, from a baseline file (format: reports/README.md):

- efficiency ([[check]] efficiency, min_efficiency, max_drop): scaling_efficiency, per-rank
  images/sec against the same sweep's single rank without distribution (backend "none"). Replay
  compute keeps its pace on a busy host while communication slows, so this is judged only for
  points during which other work used at most max_other_cores of the host (the runner measures
  it: host_other_cores); on a busier host it is reported, not judged.
- engine counters ([[check]] collectives_per_step, cycle_hold_ms): what the engine did, which load
  moves far less than the injected regressions do (the collectives per step spread up to 3-4x their
  quiet value where ranks' cycles fall differently; Tensor Fusion off is 50x): the collectives per
  step (one per fused buffer) and the time each exchange held
  work back for the cycle grid (bounded by the cycle time). A check fails when either grows past
  counter_factor times its recorded value (the hold: and past min_hold_limit_ms): Tensor Fusion
  switched off, or a much longer cycle time.
- the ring's work ([[ring]] ranks, bytes, reference, cpu_ratio, max_drop), from
  kolo-allreduce-bench's JSON (--bench): the CPU time an iteration of the reference row (the
  transport's bare ring, "link") costs over the CPU time of the same iteration of kolo's ring,
  median over the iterations, which the bench runs in turn. CPU time is the work, not the wait: a
  ring that does more per byte fails however busy the host is.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from dataclasses import dataclass, field

from reports import efficiency, files, schema

FIELDS = ("efficiency", "min_efficiency", "max_drop", "collectives_per_step", "cycle_hold_ms")
DEFAULTS = (
    "min_efficiency",
    "max_drop",
    "max_other_cores",
    "counter_factor",
    "min_hold_limit_ms",
    "ring_max_drop",
)
RING_FIELDS = ("ranks", "bytes", "reference", "cpu_ratio", "max_drop")
SELECTORS = tuple(c for c in schema.SETTING_COLUMNS)


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the key and what is allowed."""


@dataclass
class Check:
    where: dict  # CSV column -> value the rows must hold
    recorded: float
    min_efficiency: float
    max_drop: float
    max_other_cores: float = 0.25
    counter_factor: float = 3.0
    min_hold_limit_ms: float = 2.0
    collectives_per_step: float | None = None
    cycle_hold_ms: float | None = None

    def name(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.where.items())


@dataclass
class RingCheck:
    ranks: int
    bytes: int
    reference: str
    cpu_ratio: float
    max_drop: float

    def name(self) -> str:
        return f"ring ranks={self.ranks} bytes={self.bytes} vs {self.reference}"


@dataclass
class Verdict:
    check: Check | RingCheck
    config: str  # the matched configuration's distinguishing settings
    efficiency: float | None  # the measured value (efficiency, a counter or a ratio)
    ok: bool
    reason: str
    measure: str = "efficiency"
    recorded: float | None = None
    limit: str = ""
    judged: bool = True

    @property
    def drop(self) -> float | None:
        if self.efficiency is None or self.recorded is None:
            return None
        return self.recorded - self.efficiency


@dataclass
class Baseline:
    checks: list[Check]
    rings: list[RingCheck] = field(default_factory=list)


def load_baseline(path: str) -> list[Check]:
    return load(path).checks


def load(path: str) -> Baseline:
    try:
        doc = tomllib.loads(files.read_text(path, "baseline", files.CONFIG_LIMIT))
    except files.FileRefused as e:  # a FIFO, a device, a directory, too large, not UTF-8
        raise BaselineError(str(e)) from None
    except OSError as e:
        raise BaselineError(f"{path}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise BaselineError(f"{path}: not valid TOML: {e}") from None
    return parse(doc, path)


def _fraction(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise BaselineError(
            f"{where} = {value!r} is not allowed; allowed: a number >= 0 (a fraction: 0.9 = 90%)"
        )
    return float(value)


def _positive(value, where: str, at_least: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not at_least < value < float("inf"):
        raise BaselineError(f"{where} = {value!r} is not allowed; allowed: a number > {at_least:g}")
    return float(value)


def parse_baseline(doc: dict, path: str) -> list[Check]:
    return parse(doc, path).checks


def parse(doc: dict, path: str) -> Baseline:
    for key in doc:
        if key not in ("defaults", "check", "ring"):
            raise BaselineError(f"{path}: unknown key {key!r}; allowed: defaults, check, ring")
    defaults = doc.get("defaults", {})
    for key in defaults:
        if key not in DEFAULTS:
            raise BaselineError(f"{path}: unknown key [defaults] {key}; allowed: {', '.join(DEFAULTS)}")
    d_min = _fraction(defaults.get("min_efficiency", 0.0), f"{path}: [defaults] min_efficiency")
    d_drop = _fraction(defaults.get("max_drop", 1.0), f"{path}: [defaults] max_drop")
    d_cores = _fraction(defaults.get("max_other_cores", 0.25), f"{path}: [defaults] max_other_cores")
    d_factor = _positive(defaults.get("counter_factor", 3.0), f"{path}: [defaults] counter_factor", 1.0)
    d_hold = _fraction(defaults.get("min_hold_limit_ms", 2.0), f"{path}: [defaults] min_hold_limit_ms")
    d_ring_drop = _fraction(defaults.get("ring_max_drop", 0.06), f"{path}: [defaults] ring_max_drop")
    checks = []
    items = doc.get("check", [])
    if not isinstance(items, list) or not items:
        raise BaselineError(f"{path}: no [[check]] table; each names a model, ranks and efficiency")
    for i, item in enumerate(items):
        where = f"{path}: [[check]] #{i + 1}"
        for key in item:
            if key not in FIELDS and key not in SELECTORS:
                raise BaselineError(
                    f"{where}: unknown key {key!r}; allowed: {', '.join(FIELDS)} and the CSV setting "
                    f"columns {', '.join(SELECTORS)}"
                )
        for key in ("model", "ranks", "efficiency"):
            if key not in item:
                raise BaselineError(f"{where}: {key!r} is missing (model, ranks and efficiency are required)")
        if isinstance(item["ranks"], bool) or not isinstance(item["ranks"], int) or item["ranks"] < 1:
            raise BaselineError(
                f"{where}: ranks = {item['ranks']!r} is not allowed; allowed: an integer >= 1"
            )
        counters = {
            c: _positive(item[c], f"{where} {c}") if c in item else None
            for c in ("collectives_per_step", "cycle_hold_ms")
        }
        checks.append(
            Check(
                where={k: v for k, v in item.items() if k in SELECTORS},
                recorded=_fraction(item["efficiency"], f"{where} efficiency"),
                min_efficiency=_fraction(item.get("min_efficiency", d_min), f"{where} min_efficiency"),
                max_drop=_fraction(item.get("max_drop", d_drop), f"{where} max_drop"),
                max_other_cores=d_cores,
                counter_factor=d_factor,
                min_hold_limit_ms=d_hold,
                **counters,
            )
        )
    rings = []
    ring_items = doc.get("ring", [])
    if not isinstance(ring_items, list):
        raise BaselineError(f"{path}: ring must be [[ring]] tables")
    for i, item in enumerate(ring_items):
        where = f"{path}: [[ring]] #{i + 1}"
        for key in item:
            if key not in RING_FIELDS:
                raise BaselineError(f"{where}: unknown key {key!r}; allowed: {', '.join(RING_FIELDS)}")
        for key in ("ranks", "bytes", "cpu_ratio"):
            if key not in item:
                raise BaselineError(f"{where}: {key!r} is missing (ranks, bytes and cpu_ratio are required)")
        for key in ("ranks", "bytes"):
            v = item[key]
            least = 2 if key == "ranks" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise BaselineError(f"{where}: {key} = {v!r} is not allowed; allowed: an integer >= {least}")
        reference = item.get("reference", "link")
        if not isinstance(reference, str) or not reference or reference == "ring":
            raise BaselineError(
                f"{where}: reference = {reference!r} is not allowed; allowed: another row of the bench "
                "(link, gloo-ring-chunked, mpi-direct, ...)"
            )
        rings.append(
            RingCheck(
                ranks=item["ranks"],
                bytes=item["bytes"],
                reference=reference,
                cpu_ratio=_positive(item["cpu_ratio"], f"{where} cpu_ratio"),
                max_drop=_fraction(item.get("max_drop", d_ring_drop), f"{where} max_drop"),
            )
        )
    return Baseline(checks, rings)


def _same(cell: str, value) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(cell) == float(value)
        except ValueError:
            return False
    return cell == str(value)


def evaluate(rows: list[dict], checks: list[Check]) -> list[Verdict]:
    """Verdicts for every configuration each check matches (a check that matches nothing fails):
    its efficiency, and each engine counter the check records."""
    rows = efficiency.with_efficiency(schema.latest_per_point(rows))
    verdicts = []
    for check in checks:
        matched = [r for r in rows if all(_same(r.get(k, ""), v) for k, v in check.where.items())]
        if check.where.get("backend") != efficiency.BASELINE_BACKEND:
            # The baselines are 1.0 by definition: a check at 1 rank means the engine's ranks.
            matched = [r for r in matched if not efficiency.is_baseline(r)]
        if not matched:
            verdicts.append(Verdict(check, "", None, False, "no row of the CSV matches"))
            continue
        groups: dict[tuple, list[dict]] = {}
        for r in matched:
            groups.setdefault(efficiency.config_key(r), []).append(r)
        distinct = [
            c
            for c in efficiency.CONFIG_COLUMNS
            if c not in check.where and len({r.get(c, "") for r in matched}) > 1
        ]
        for members in groups.values():
            config = " ".join(f"{c}={members[0].get(c, '')}" for c in distinct)
            verdicts.append(_judge(check, config, members))
            verdicts += _judge_counters(check, config, members)
    return verdicts


def _other_cores(members: list[dict]) -> float | None:
    loads = [x for r in members if (x := schema.number(r, "host_other_cores")) is not None]
    return max(loads) if loads else None


def _judge(check: Check, config: str, members: list[dict]) -> Verdict:
    good = [r for r in members if r["status"] == "ok"]
    if not good:
        return Verdict(check, config, None, False, f"point failed: {members[-1]['error'] or 'no error text'}")
    effs = [schema.number(r, "scaling_efficiency") for r in good]
    effs = [e for e in effs if e is not None]
    if not effs:
        return Verdict(
            check,
            config,
            None,
            False,
            "no efficiency: the sweep has no ok single-rank baseline (backend none) with this "
            "model, batch, compute and precision",
        )
    eff = sum(effs) / len(effs)
    limit = f">= {check.min_efficiency:.2f}, drop <= {check.max_drop:.2f}"
    busy = _other_cores(good)
    if busy is not None and busy > check.max_other_cores:
        return Verdict(
            check,
            config,
            eff,
            True,
            f"not judged: other work used {busy:.2f} cores of the host during the point (at most "
            f"{check.max_other_cores:.2f} for a time-based check); the engine counters still judge",
            recorded=check.recorded,
            limit=limit,
            judged=False,
        )
    reasons = []
    if eff < check.min_efficiency:
        reasons.append(f"below the minimum {check.min_efficiency:.2f}")
    if check.recorded - eff > check.max_drop:
        reasons.append(
            f"dropped {check.recorded - eff:.3f} from {check.recorded:.2f} (allowed {check.max_drop:.2f})"
        )
    return Verdict(
        check, config, eff, not reasons, "; ".join(reasons) or "ok", recorded=check.recorded, limit=limit
    )


def _judge_counters(check: Check, config: str, members: list[dict]) -> list[Verdict]:
    good = [r for r in members if r["status"] == "ok"]
    verdicts = []
    f = check.counter_factor
    for column, recorded, floor in (
        ("collectives_per_step", check.collectives_per_step, 0.0),
        ("cycle_hold_ms", check.cycle_hold_ms, check.min_hold_limit_ms),
    ):
        if recorded is None or not good:
            continue
        bound = max(recorded * f, floor)
        limit = f"<= {bound:.2f}"
        values = [x for r in good if (x := schema.number(r, column)) is not None]
        if not values:
            verdicts.append(
                Verdict(
                    check,
                    config,
                    None,
                    False,
                    f"the CSV has no {column} (written by an older kolo-train?)",
                    measure=column,
                    recorded=recorded,
                    limit=limit,
                )
            )
            continue
        value = sum(values) / len(values)
        if value <= bound:
            reason = "ok"
        elif column == "collectives_per_step":
            reason = (
                f"{value:.1f} per step, more than {f:g} x the recorded {recorded:.1f}: the engine fuses "
                "far fewer tensors per collective (Tensor Fusion off or broken?)"
            )
        else:
            reason = (
                f"{value:.2f} ms per exchange, more than {bound:.2f} (the recorded {recorded:.2f} x {f:g}, "
                f"at least {floor:g}): the engine holds work back far longer (a longer cycle time?)"
            )
        verdicts.append(
            Verdict(
                check, config, value, reason == "ok", reason, measure=column, recorded=recorded, limit=limit
            )
        )
    return verdicts


def load_bench(path: str) -> dict:
    """A kolo-allreduce-bench JSON (--json), or BaselineError naming what is wrong with it."""
    try:
        doc = json.loads(files.read_text(path, "--bench", files.RECORD_LIMIT))
    except files.FileRefused as e:
        raise BaselineError(str(e)) from None
    except OSError as e:
        raise BaselineError(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise BaselineError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or "ranks" not in doc:
        raise BaselineError(f"{path}: not a kolo-allreduce-bench JSON (no 'ranks' and 'rows')")
    return doc


def paired_ratio(ref: dict, mine: dict, what: str) -> float | None:
    """Median over the iterations of ref's cost over mine's in the same iteration, from two bench
    rows of one size: `what` "cpu" (every rank's CPU time) or "time" (wall time). None when the
    rows lack per-iteration values."""
    try:
        a, b = (r["cpu_iters_us"] if what == "cpu" else r["time"]["iters_us"] for r in (ref, mine))
        return statistics.median(x / y for x, y in zip(a, b, strict=True) if y > 0)
    except (KeyError, TypeError, ValueError, statistics.StatisticsError):
        return None


def evaluate_rings(benches: list[dict], rings: list[RingCheck]) -> list[Verdict]:
    """One verdict per [[ring]] check, from the bench run with its rank count."""
    verdicts = []
    for ring in rings:
        limit = f"drop <= {ring.max_drop:.2f}"
        docs = [d for d in benches if d.get("ranks") == ring.ranks]
        rows = {
            r.get("backend"): r
            for d in docs
            for r in d["rows"]
            if isinstance(r, dict) and r.get("bytes") == ring.bytes
        }
        mine, ref = rows.get("ring"), rows.get(ring.reference)

        def fail(reason, value=None, ring=ring, limit=limit):
            return Verdict(
                ring, "", value, False, reason, measure="ring cpu ratio", recorded=ring.cpu_ratio, limit=limit
            )

        if not docs:
            verdicts.append(
                fail(f"no bench JSON at {ring.ranks} ranks (pass kolo-allreduce-bench --json with --bench)")
            )
            continue
        if mine is None or ref is None:
            verdicts.append(
                fail(
                    f"the bench at {ring.ranks} ranks has no ring and {ring.reference} rows "
                    f"of {ring.bytes} bytes"
                )
            )
            continue
        if mine.get("wrong"):
            verdicts.append(fail(f"kolo's ring computed {mine['wrong']} wrong element(s)"))
            continue
        ratio = paired_ratio(ref, mine, "cpu")
        wall = paired_ratio(ref, mine, "time")
        if ratio is None:
            verdicts.append(
                fail("the bench rows have no per-iteration CPU times (an older kolo-allreduce-bench?)")
            )
            continue
        drop = ring.cpu_ratio - ratio
        info = f"wall-time ratio {wall:.3f}, not judged" if wall is not None else ""
        if drop > ring.max_drop:
            reason = (
                f"dropped {drop:.3f} from {ring.cpu_ratio:.3f} (allowed {ring.max_drop:.2f}): kolo's ring "
                f"costs more CPU per iteration against {ring.reference} ({info})"
            )
        else:
            reason = f"ok ({info})"
        verdicts.append(
            Verdict(
                ring,
                "",
                ratio,
                drop <= ring.max_drop,
                reason,
                measure="ring cpu ratio",
                recorded=ring.cpu_ratio,
                limit=limit,
            )
        )
    return verdicts


def table(verdicts: list[Verdict], only_failures: bool = False) -> str:
    """A fixed-width table of verdicts."""
    header = ("check", "configuration", "measure", "value", "recorded", "limit", "result")
    lines = []
    for v in verdicts:
        if only_failures and v.ok:
            continue
        lines.append(
            (
                v.check.name(),
                v.config or "-",
                v.measure,
                "-" if v.efficiency is None else f"{v.efficiency:.3f}",
                "-" if v.recorded is None else f"{v.recorded:.3f}",
                v.limit or "-",
                ("ok" if v.reason == "ok" else v.reason) if v.ok else "FAIL: " + v.reason,
            )
        )
    widths = [
        max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)
    ]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    return "\n".join(out)


def baseline_text(rows: list[dict], min_efficiency: float, max_drop: float, header: str = "") -> str:
    """A baseline file recording the efficiency of every configuration at every rank count in
    `rows`, the single-rank baselines (1.0 by definition) left out. Each check names the model,
    the rank count and the settings that tell the CSV's configurations apart."""
    rows = efficiency.with_efficiency(schema.latest_per_point(rows))
    ok = [r for r in rows if r["status"] == "ok" and r["scaling_efficiency"]]
    distinct = [c for c in efficiency.CONFIG_COLUMNS if c != "model" and len({r.get(c, "") for r in ok}) > 1]
    models = {r["model"] for r in ok}
    if "profile" in distinct and len({(r["model"], r["profile"]) for r in ok}) == len(models):
        distinct.remove("profile")  # one profile per model: the model selects it
    groups: dict[tuple, list[dict]] = {}
    for r in ok:
        if efficiency.is_baseline(r):
            continue  # 1.0 by definition
        key = (r["model"], int(r["ranks"]), *(r.get(c, "") for c in distinct))
        groups.setdefault(key, []).append(r)
    lines = [header.rstrip("\n")] if header else []
    lines += ["[defaults]", f"min_efficiency = {min_efficiency:g}", f"max_drop = {max_drop:g}"]
    for key, members in sorted(groups.items()):
        model, ranks, *rest = key
        lines += ["", "[[check]]", f'model = "{model}"', f"ranks = {ranks}"]
        for c, v in zip(distinct, rest, strict=True):
            if v != "":
                lines.append(f"{c} = {_toml_value(c, v)}")
        effs = [float(r["scaling_efficiency"]) for r in members]
        lines.append(f"efficiency = {sum(effs) / len(effs):.3f}")
        for column in ("collectives_per_step", "cycle_hold_ms"):
            values = [x for r in members if (x := schema.number(r, column))]
            if values:
                lines.append(f"{column} = {sum(values) / len(values):.2f}")
    return "\n".join(lines) + "\n"


def _toml_value(column: str, text: str) -> str:
    if column in schema.NUMERIC:
        value = float(text)
        return str(int(value)) if value.is_integer() else repr(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
