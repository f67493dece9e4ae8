"""Predicted against measured images/sec per configuration (the median of its measured repeats, and
the spread over them), then the median and worst absolute error."""

from __future__ import annotations

import argparse
import statistics
import sys

from reports import schema

KEY = (
    "model",
    "ranks",
    "backend",
    "transport",
    "ps_servers",
    "ps_placement",
    "ps_pacing",
    "fusion_threshold_mb",
)


def _key(row: dict) -> tuple:
    return tuple(row.get(k, "") for k in KEY)


def compare(predicted: list[dict], measured: list[dict]) -> list[dict]:
    """One entry per predicted configuration (KEY settings) that has measured ok rows.

    A configuration measured more than once (a sweep's repeats) is compared with the median of its
    repeats, and its spread, (max - min) / median over them, says how far the measurement itself
    moved between runs: an error inside it cannot be told from the measurement's own noise.
    """
    meas: dict[tuple, list[float]] = {}
    for r in schema.latest_per_point(measured):
        if r["status"] == "ok":
            meas.setdefault(_key(r), []).append(float(r["total_images_per_sec"]))
    preds: dict[tuple, dict] = {}
    for p in schema.latest_per_point(predicted):
        if p["status"] == "ok" and _key(p) in meas:
            preds.setdefault(_key(p), p)
    out = []
    for key, p in preds.items():
        values = meas[key]
        mv = statistics.median(values)
        pv = float(p["total_images_per_sec"])
        out.append(
            {
                **{k: p[k] for k in KEY},
                "predicted": pv,
                "measured": mv,
                "repeats": len(values),
                "spread": (max(values) - min(values)) / mv,
                "error": (pv - mv) / mv,
            }
        )
    return out


def table(pairs: list[dict]) -> str:
    # The parameter server's push pacing, where some point sets it.
    paced = any(x.get("ps_pacing") for x in pairs)
    lines = [
        "| model | GPUs | backend | "
        + ("ps pacing | " if paced else "")
        + "fusion MiB | measured img/s | repeats | spread | predicted img/s | error |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if paced else ""),
    ]
    for x in pairs:
        spread = f"{100 * x['spread']:.1f}%" if x["repeats"] > 1 else "-"
        pacing = f"{x.get('ps_pacing') or ('off' if x['backend'] == 'ps' else '-')} | " if paced else ""
        lines.append(
            f"| {x['model']} | {x['ranks']} | {x['backend']} | {pacing}{x['fusion_threshold_mb'] or '-'} "
            f"| {x['measured']:.1f} | {x['repeats']} | {spread} | {x['predicted']:.1f} "
            f"| {100 * x['error']:+.1f}% |"
        )
    errs = [abs(x["error"]) for x in pairs]
    lines.append("")
    lines.append(
        f"{len(pairs)} points: median absolute error {100 * statistics.median(errs):.1f}%, "
        f"worst {100 * max(errs):.1f}% (goal: median <= 5%, worst <= 12%)"
    )
    repeated = [x for x in pairs if x["repeats"] > 1]
    if repeated:
        inside = sum(1 for x in repeated if abs(x["error"]) <= x["spread"])
        spreads = [x["spread"] for x in repeated]
        lines.append(
            f"measured spread over repeats (max - min over the median): median "
            f"{100 * statistics.median(spreads):.1f}%, worst {100 * max(spreads):.1f}%; "
            f"{inside} of {len(repeated)} repeated points predicted within their spread"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/sim-validate")
    ap.add_argument("predicted")
    ap.add_argument("measured")
    ap.add_argument("--markdown")
    a = ap.parse_args(argv)
    pairs = compare(schema.read_rows(a.predicted), schema.read_rows(a.measured))
    if not pairs:
        print(
            "sim-validate: no predicted row has a measured twin (same model, ranks, backend, transport)",
            file=sys.stderr,
        )
        return 1
    text = table(pairs)
    print(text, end="")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
