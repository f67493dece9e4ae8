"""The regression gate: a sweep's scaling efficiency against a baseline file.

Efficiency is scaling_efficiency (reports/efficiency.py): per-rank images/sec against the same
sweep's single-rank run without distributed communication (backend "none").

Baseline format (reports/README.md): [defaults] min_efficiency and max_drop; [[check]] tables each
naming a model and a rank count (plus any other CSV setting column to narrow the rows), the
recorded efficiency, and optionally their own min_efficiency and max_drop. A check passes when
every configuration it matches has efficiency >= min_efficiency and recorded - efficiency <=
max_drop (both as fractions, 0.9 = 90%).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

from reports import efficiency, schema

FIELDS = ("efficiency", "min_efficiency", "max_drop")
SELECTORS = tuple(c for c in schema.SETTING_COLUMNS)


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the key and what is allowed."""


@dataclass
class Check:
    where: dict  # CSV column -> value the rows must hold
    recorded: float
    min_efficiency: float
    max_drop: float

    def name(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.where.items())


@dataclass
class Verdict:
    check: Check
    config: str  # the matched configuration's distinguishing settings
    efficiency: float | None
    ok: bool
    reason: str

    @property
    def drop(self) -> float | None:
        return None if self.efficiency is None else self.check.recorded - self.efficiency


def load_baseline(path: str) -> list[Check]:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise BaselineError(f"{path}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise BaselineError(f"{path}: not valid TOML: {e}") from None
    return parse_baseline(doc, path)


def _fraction(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise BaselineError(
            f"{where} = {value!r} is not allowed; allowed: a number >= 0 (a fraction: 0.9 = 90%)"
        )
    return float(value)


def parse_baseline(doc: dict, path: str) -> list[Check]:
    for key in doc:
        if key not in ("defaults", "check"):
            raise BaselineError(f"{path}: unknown key {key!r}; allowed: defaults, check")
    defaults = doc.get("defaults", {})
    for key in defaults:
        if key not in ("min_efficiency", "max_drop"):
            raise BaselineError(f"{path}: unknown key [defaults] {key}; allowed: min_efficiency, max_drop")
    d_min = _fraction(defaults.get("min_efficiency", 0.0), f"{path}: [defaults] min_efficiency")
    d_drop = _fraction(defaults.get("max_drop", 1.0), f"{path}: [defaults] max_drop")
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
        checks.append(
            Check(
                where={k: v for k, v in item.items() if k in SELECTORS},
                recorded=_fraction(item["efficiency"], f"{where} efficiency"),
                min_efficiency=_fraction(item.get("min_efficiency", d_min), f"{where} min_efficiency"),
                max_drop=_fraction(item.get("max_drop", d_drop), f"{where} max_drop"),
            )
        )
    return checks


def _same(cell: str, value) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(cell) == float(value)
        except ValueError:
            return False
    return cell == str(value)


def evaluate(rows: list[dict], checks: list[Check]) -> list[Verdict]:
    """One verdict per configuration each check matches (a check that matches nothing fails)."""
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
    return verdicts


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
    reasons = []
    if eff < check.min_efficiency:
        reasons.append(f"below the minimum {check.min_efficiency:.2f}")
    if check.recorded - eff > check.max_drop:
        reasons.append(
            f"dropped {check.recorded - eff:.3f} from {check.recorded:.2f} (allowed {check.max_drop:.2f})"
        )
    return Verdict(check, config, eff, not reasons, "; ".join(reasons) or "ok")


def table(verdicts: list[Verdict], only_failures: bool = False) -> str:
    """A fixed-width table of verdicts."""
    header = ("check", "configuration", "efficiency", "recorded", "drop", "min", "max drop", "result")
    lines = []
    for v in verdicts:
        if only_failures and v.ok:
            continue
        lines.append(
            (
                v.check.name(),
                v.config or "-",
                "-" if v.efficiency is None else f"{v.efficiency:.3f}",
                f"{v.check.recorded:.3f}",
                "-" if v.drop is None else f"{v.drop:+.3f}",
                f"{v.check.min_efficiency:.2f}",
                f"{v.check.max_drop:.2f}",
                "ok" if v.ok else "FAIL: " + v.reason,
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
    groups: dict[tuple, list[float]] = {}
    for r in ok:
        if efficiency.is_baseline(r):
            continue  # 1.0 by definition
        key = (r["model"], int(r["ranks"]), *(r.get(c, "") for c in distinct))
        groups.setdefault(key, []).append(float(r["scaling_efficiency"]))
    lines = [header.rstrip("\n")] if header else []
    lines += ["[defaults]", f"min_efficiency = {min_efficiency:g}", f"max_drop = {max_drop:g}"]
    for key, effs in sorted(groups.items()):
        model, ranks, *rest = key
        lines += ["", "[[check]]", f'model = "{model}"', f"ranks = {ranks}"]
        for c, v in zip(distinct, rest, strict=True):
            if v != "":
                lines.append(f"{c} = {_toml_value(c, v)}")
        lines.append(f"efficiency = {sum(effs) / len(effs):.3f}")
    return "\n".join(lines) + "\n"


def _toml_value(column: str, text: str) -> str:
    if column in schema.NUMERIC:
        value = float(text)
        return str(int(value)) if value.is_integer() else repr(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
