"""The report of a sweep folder: plots (PNG and SVG) and one HTML page that opens offline.

    DIR/results.csv  ->  DIR/report/index.html, DIR/report/plots/<name>.{png,svg}

The page links its images relatively and loads nothing from the network.
"""

from __future__ import annotations

import html
import os
from collections import Counter

from reports import efficiency, plots, schema
from reports.efficiency import Point

CSS = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f0f0f0; }
td.text { text-align: left; }
.replay { background: #b00020; color: white; padding: 1px 6px; border-radius: 3px; font-weight: bold; }
.banner { border: 2px solid #b00020; padding: 0.6em 1em; color: #b00020; font-weight: bold; }
.failed { color: #b00020; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
"""


def build(out_dir: str) -> str:
    """Writes the report of `out_dir` (which holds results.csv); returns the HTML page's path.
    Raises FileNotFoundError without results.csv, schema.SchemaError on a malformed one."""
    csv_path = os.path.join(out_dir, "results.csv")
    if not os.path.exists(csv_path):
        raise FileNotFoundError(f"{csv_path} does not exist (run scripts/sweep FILE --out {out_dir} first)")
    rows = efficiency.with_efficiency(schema.latest_per_point(schema.read_rows(csv_path)))
    report_dir = os.path.join(out_dir, "report")
    plot_dir = os.path.join(report_dir, "plots")
    os.makedirs(plot_dir, exist_ok=True)
    for name in os.listdir(plot_dir):  # figures of an earlier report the data no longer supports
        if name.endswith((".png", ".svg")):
            os.unlink(os.path.join(plot_dir, name))
    points = efficiency.aggregate(rows)
    figures = []
    for stem, caption, fig in plots.all_figures(points):
        plots.save(fig, os.path.join(plot_dir, stem))
        figures.append((stem, caption))
    sweep_name = _sweep_name(out_dir)
    page = render(rows, points, figures, sweep_name)
    path = os.path.join(report_dir, "index.html")
    with open(path, "w") as f:
        f.write(page)
    return path


def _sweep_name(out_dir: str) -> str:
    copy = os.path.join(out_dir, "sweep.toml")
    if os.path.exists(copy):
        import tomllib

        try:
            with open(copy, "rb") as f:
                return tomllib.load(f).get("sweep", {}).get("name", "") or os.path.basename(out_dir)
        except (OSError, tomllib.TOMLDecodeError):
            pass
    return os.path.basename(os.path.abspath(out_dir))


def render(rows: list[dict], points: list[Point], figures: list[tuple[str, str]], name: str) -> str:
    """The HTML page (a pure function of its inputs)."""
    e = html.escape
    ok = sum(r["status"] == "ok" for r in rows)
    failed = len(rows) - ok
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>kolo sweep report: {e(name)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>kolo sweep report: {e(name)}</h1>",
        f"<p>{len(rows)} points: {ok} ok, <span class='failed'>{failed} failed</span>. "
        "Data: <a href='../results.csv'>results.csv</a> (columns: reports/SCHEMA.md).</p>",
        _environment(rows),
    ]
    if any(r["compute"] == "replay" for r in rows):
        parts.append(
            "<p class='banner'>Rows marked <span class='replay'>replay</span> ran with "
            f"{e(plots.REPLAY_NOTE)}. They measure communication at the recorded compute pace.</p>"
        )
    parts.append("<h2>Plots</h2>")
    if not figures:
        parts.append("<p>No plot: the data has a single rank count and no knob that varies.</p>")
    for stem, caption in figures:
        parts.append(
            f"<figure><img src='plots/{stem}.png' alt='{e(caption)}'>"
            f"<figcaption>{e(caption)} (<a href='plots/{stem}.svg'>SVG</a>)</figcaption></figure>"
        )
    parts += [_summary_table(points), _ratio_tables(points), _failures(rows)]
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def _environment(rows: list[dict]) -> str:
    e = html.escape
    items = []
    for column, title in (
        ("kolo_commit", "kolo commit"),
        ("hosts", "hosts"),
        ("cpu_model", "CPU"),
        ("gpu_model", "GPU"),
        ("run_id", "runs"),
    ):
        values = Counter(r[column] for r in rows if r[column])
        if values:
            items.append(f"<li>{title}: " + ", ".join(e(v) for v in values) + "</li>")
    return "<ul>" + "".join(items) + "</ul>" if items else ""


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _summary_table(points: list[Point]) -> str:
    e = html.escape
    cols = ["model"] + efficiency.varying(points, exclude=("model",))
    if "profile" in cols and len({(p.config["model"], p.config["profile"]) for p in points}) == len(
        {p.config["model"] for p in points}
    ):
        cols.remove("profile")  # one profile per model: the model says it
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    head += (
        "<th>ranks</th><th>nodes</th><th>images/sec</th><th>±</th><th>per GPU</th>"
        "<th>efficiency</th><th>ok</th><th>failed</th>"
    )
    body = []
    for p in points:
        cells = []
        for c in cols:
            v = p.config.get(c, "")
            if c == "compute" and v == "replay":
                cells.append("<td class='text'><span class='replay'>replay</span></td>")
            else:
                cells.append(f"<td class='text'>{e(v)}</td>")
        if "compute" not in cols and p.replay:
            cells[0] = (
                f"<td class='text'>{e(p.config.get('model', ''))} <span class='replay'>replay</span></td>"
            )
        eff = _fmt(p.efficiency * 100 if p.efficiency is not None else None, ".1f")
        cells.append(
            f"<td>{p.ranks}</td><td>{e(p.nodes)}</td><td>{_fmt(p.total, '.1f')}</td>"
            f"<td>{_fmt(p.total_spread, '.1f')}</td><td>{_fmt(p.per_rank, '.1f')}</td>"
            f"<td>{eff + '%' if eff else ''}</td><td>{p.ok}</td>"
            f"<td class='{'failed' if p.failed else ''}'>{p.failed}</td>"
        )
        body.append("<tr>" + "".join(cells) + "</tr>")
    return "<h2>Results</h2><table><tr>" + head + "</tr>" + "".join(body) + "</table>"


def ratios(points: list[Point], column: str, better: str, worse: str) -> list[tuple[dict, int, float]]:
    """(configuration without `column`, ranks, images/sec with `better` over with `worse`) for
    each pair of points that differ only in `column`. ps-only settings are ignored when pairing
    ring with ps, so every ps variant is compared with the one ring point."""
    ignore = {column} | ({"ps_servers", "ps_placement"} if column == "backend" else set())

    def key(p: Point) -> tuple:
        return tuple((k, v) for k, v in sorted(p.config.items()) if k not in ignore) + (p.ranks,)

    best = {key(p): p for p in points if p.total and p.config.get(column) == better}
    out = []
    for q in points:
        p = best.get(key(q))
        if q.total and q.config.get(column) == worse and p is not None:
            out.append((q.config, q.ranks, p.total / q.total))
    return out


def _ratio_tables(points: list[Point]) -> str:
    e = html.escape
    parts = []
    for column, better, worse, title in (
        ("backend", "ring", "ps", "ring-allreduce over parameter server"),
        ("transport", "rdma", "tcp", "RDMA over TCP"),
    ):
        found = ratios(points, column, better, worse)
        if not found:
            continue
        rows = []
        for config, ranks, ratio in found:
            extra = ""
            if column == "backend":
                servers, placement = config.get("ps_servers", ""), config.get("ps_placement", "")
                extra = f" (ps servers={servers}, placement={placement})"
            rows.append(
                f"<tr><td class='text'>{e(config.get('model', ''))}{e(extra)}</td><td>{ranks}</td>"
                f"<td>{ratio:.2f}×</td></tr>"
            )
        parts.append(
            f"<h3>{e(title)}</h3><table><tr><th>model</th><th>ranks</th><th>speed-up</th></tr>"
            + "".join(rows)
            + "</table>"
        )
    return ("<h2>Comparisons</h2>" + "".join(parts)) if parts else ""


def _failures(rows: list[dict]) -> str:
    e = html.escape
    bad = [r for r in rows if r["status"] != "ok"]
    if not bad:
        return ""
    body = "".join(
        f"<tr><td class='text'>{e(r['point_id'])}</td><td class='text'>{e(r['model'])}</td>"
        f"<td>{e(r['ranks'])}</td>"
        f"<td class='text'>{e(r['backend'])}</td><td class='text failed'>{e(r['error'])}</td>"
        f"<td class='text'><a href='../{e(r['log'])}'>log</a></td></tr>"
        for r in bad
    )
    return (
        "<h2>Failed points</h2><table><tr><th>point</th><th>model</th><th>ranks</th><th>backend</th>"
        "<th>error</th><th>log</th></tr>" + body + "</table>"
    )
