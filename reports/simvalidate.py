"""Predicted against measured images/sec: per point, then the median and worst absolute error."""

from __future__ import annotations

import argparse
import statistics
import sys

from reports import schema

KEY = ("model", "ranks", "backend", "transport", "ps_servers", "ps_placement", "fusion_threshold_mb")


def _key(row: dict) -> tuple:
    return tuple(row.get(k, "") for k in KEY)


def compare(predicted: list[dict], measured: list[dict]) -> list[dict]:
    """One entry per predicted ok row that has a measured ok row with the same KEY settings."""
    meas = {_key(r): r for r in schema.latest_per_point(measured) if r["status"] == "ok"}
    out = []
    for p in schema.latest_per_point(predicted):
        m = meas.get(_key(p))
        if p["status"] != "ok" or m is None:
            continue
        pv, mv = float(p["total_images_per_sec"]), float(m["total_images_per_sec"])
        out.append({**{k: p[k] for k in KEY}, "predicted": pv, "measured": mv, "error": (pv - mv) / mv})
    return out


def table(pairs: list[dict]) -> str:
    lines = [
        "| model | GPUs | backend | fusion MiB | measured img/s | predicted img/s | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in pairs:
        lines.append(
            f"| {x['model']} | {x['ranks']} | {x['backend']} | {x['fusion_threshold_mb'] or '-'} "
            f"| {x['measured']:.1f} | {x['predicted']:.1f} "
            f"| {100 * x['error']:+.1f}% |"
        )
    errs = [abs(x["error"]) for x in pairs]
    lines.append("")
    lines.append(
        f"{len(pairs)} points: median absolute error {100 * statistics.median(errs):.1f}%, "
        f"worst {100 * max(errs):.1f}% (goal: median <= 5%, worst <= 12%)"
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
