"""The report of a sweep folder: plots (PNG and SVG) and one HTML page that opens offline.

    DIR/results.csv  ->  DIR/report/index.html, DIR/report/plots/<name>.{png,svg}

The page links its images relatively and loads nothing from the network.
"""

from __future__ import annotations

import html
import os
from collections import Counter

from reports import efficiency, files, plots, schema, settings, simvalidate
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
.side { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
.side figure { flex: 1 1 40%; min-width: 420px; margin: 0.5em 0; }
.defs { border-left: 4px solid #4c72b0; padding: 0.3em 0.8em; background: #f6f8fb; }
.base { color: #555; font-style: italic; }
ul.why li { margin: 0.25em 0; }
"""

# The two efficiencies, as the page states them near its top.
DEFINITIONS = (
    "<b>Scaling efficiency</b> = images/sec per GPU ÷ images/sec of one rank training without "
    "distribution (kolo-train --backend none, same model, batch, compute and precision); 100% is "
    "linear scaling, and every backend of a model is measured against the same run.",
    "<b>Efficiency vs own smallest rank count</b> = images/sec per GPU ÷ that of the same "
    "configuration at its smallest rank count that ran: how a configuration scales from where it "
    "starts, not how it compares with training without distribution.",
)
# Side by side on the page: the efficiency figure and where the time went.
SIDE_BY_SIDE = ("efficiency", "breakdown")


def build(out_dir: str, predicted: str | None = None) -> str:
    """Writes the report of `out_dir` (which holds results.csv); returns the HTML page's path.
    `predicted`: a results CSV of kolo-sim's predictions, drawn beside the measured rows they
    predict (reports.simvalidate) with each point's error. Raises FileNotFoundError without
    results.csv or the predicted file, schema.SchemaError on a malformed one or one that cannot be
    read (reports.files: a FIFO, a device, a directory, a file too large)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise FileNotFoundError(
            f"{out_dir} is not a folder (give a sweep's --out folder, which holds results.csv)"
        )
    csv_path = os.path.join(out_dir, "results.csv")
    if not os.path.exists(csv_path):
        raise FileNotFoundError(f"{csv_path} does not exist (run scripts/sweep FILE --out {out_dir} first)")
    measured = schema.read_rows(csv_path)
    pairs = None
    if predicted is not None:
        if not os.path.exists(predicted):
            raise FileNotFoundError(f"--predicted {predicted} does not exist")
        pairs = simvalidate.compare(schema.read_rows(predicted, "--predicted CSV"), measured)
    rows = efficiency.with_efficiency(schema.latest_per_point(measured))
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
    if pairs:
        plots.save(simvalidate.figure(pairs), os.path.join(plot_dir, PREDICTED))
        figures.insert(0, (PREDICTED, f"kolo-sim's predictions ({predicted}) beside these measurements"))
    sweep_name = _sweep_name(out_dir)
    page = render(rows, points, figures, sweep_name, _fallback_note(out_dir), pairs)
    path = os.path.join(report_dir, "index.html")
    with open(path, "w") as f:
        f.write(page)
    return path


# The figure of predictions beside measurements (build's `predicted`).
PREDICTED = "predicted"

# Written by the sweep when a sweep meant for an emulated network ran over loopback instead
# (reports.runner.FALLBACK_NOTE).
FALLBACK_NOTE = "network.txt"
# The figures that compare backends across rank counts: the fallback note goes under them too.
COMPARISONS = ("ring-vs-ps", "backends", "scaling", "efficiency")


def _fallback_note(out_dir: str) -> str | None:
    path = os.path.join(out_dir, FALLBACK_NOTE)
    try:
        return " ".join(files.read_text(path, "network note", files.CONFIG_LIMIT).split()) or None
    except OSError:
        return None


def _sweep_name(out_dir: str) -> str:
    copy = os.path.join(out_dir, "sweep.toml")
    if os.path.exists(copy):
        import tomllib

        try:
            doc = tomllib.loads(files.read_text(copy, "sweep file", files.CONFIG_LIMIT))
            return doc.get("sweep", {}).get("name", "") or os.path.basename(out_dir)
        except (OSError, tomllib.TOMLDecodeError):
            pass
    return os.path.basename(os.path.abspath(out_dir))


def render(
    rows: list[dict],
    points: list[Point],
    figures: list[tuple[str, str]],
    name: str,
    fallback_note: str | None = None,
    pairs: list[dict] | None = None,
) -> str:
    """The HTML page (a pure function of its inputs). `fallback_note`: why a sweep meant for an
    emulated network ran over loopback, said above the plots and under the comparisons. `pairs`:
    predictions against these measurements (reports.simvalidate.compare), tabled with their
    errors; an empty list says that no prediction matched."""
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
        "<p class='defs'>" + "<br>".join(DEFINITIONS) + "</p>",
        _environment(rows),
    ]
    if any(r["compute"] == "replay" for r in rows):
        parts.append(
            "<p class='banner'>Rows marked <span class='replay'>replay</span> ran with "
            f"{e(plots.REPLAY_NOTE)}. They measure communication at the recorded compute pace.</p>"
        )
    dilated = sorted({r["dilation"] for r in rows if r.get("dilation") not in ("", "1")}, key=float)
    if dilated:
        parts.append(
            f"<p class='banner'>Time dilation {e(', '.join(dilated))}: every replayed layer time "
            "was slept that many times over, on emulated links that many times slower than the "
            "links they stand for (column link_represented), so compute and network keep their "
            "true ratio. Every time and images/sec shown is the measured one divided by the "
            "dilation: the pace the run stands for. The host's own work (the engine's copies, "
            "sums and negotiation) is divided too, so it stands for a host that many times "
            "faster.</p>"
        )
    if points and not any(p.is_baseline and p.total is not None for p in points):
        parts.append(
            "<p class='banner'>No single-rank run without distribution (backend none) succeeded in "
            "this data, so there is no scaling efficiency; the tables and plots show the efficiency "
            "vs each configuration's own smallest rank count.</p>"
        )
    parts.append("<h2>Plots</h2>")
    if fallback_note:
        parts.append(f"<p class='banner'>Not on an emulated network: {e(fallback_note)}.</p>")
    if not figures:
        parts.append("<p>No plot: the data has a single rank count and no knob that varies.</p>")
    stems = [stem for stem, _ in figures]
    side = [f for f in figures if f[0] in SIDE_BY_SIDE] if all(s in stems for s in SIDE_BY_SIDE) else []
    why = _time_section(points)  # the sentences go right under the breakdown figure
    if fallback_note:
        figures = [
            (stem, caption + (". Over loopback on one host, not a network" if stem in COMPARISONS else ""))
            for stem, caption in figures
        ]
    for stem, caption in figures:
        if side and stem in SIDE_BY_SIDE:
            if stem == side[0][0]:  # the pair, where the first of them would be
                parts.append("<div class='side'>" + "".join(_figure(s, c) for s, c in side) + "</div>")
                parts.append(why)
        else:
            parts.append(_figure(stem, caption))
            if stem == "breakdown":
                parts.append(why)
    if "breakdown" not in stems:
        parts.append(why)
    if pairs is not None:
        parts.append(_predicted_table(pairs))
    parts += [_summary_table(points), _breakdown_table(points), _ratio_tables(points), _failures(rows)]
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def _predicted_table(pairs: list[dict]) -> str:
    e = html.escape
    if not pairs:
        return (
            "<h2>Predicted against measured</h2><p class='banner'>No predicted row has a measured "
            "twin here (same model, ranks, backend, transport, servers and fusion).</p>"
        )
    head = ["model", "GPUs", "backend", "transport", "fusion MiB", "measured img/s", "repeats", "spread"]
    head += ["predicted img/s", "error"]
    lines = [
        "<h2>Predicted against measured</h2><table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
    ]
    for x in pairs:
        spread = f"{100 * x['spread']:.1f}%" if x["repeats"] > 1 else "-"
        cells = [x["model"], x["ranks"], x["backend"], x["transport"] or "-", x["fusion_threshold_mb"] or "-"]
        cells += [f"{x['measured']:.1f}", str(x["repeats"]), spread, f"{x['predicted']:.1f}"]
        cells.append(f"{100 * x['error']:+.1f}%")
        lines.append("<tr>" + "".join(f"<td class='text'>{e(str(c))}</td>" for c in cells[:5]))
        lines[-1] += "".join(f"<td>{e(c)}</td>" for c in cells[5:]) + "</tr>"
    lines.append("</table>")
    lines.append("<p>" + "<br>".join(e(s) for s in simvalidate.summary(pairs)) + "</p>")
    return "\n".join(lines)


def _figure(stem: str, caption: str) -> str:
    e = html.escape
    return (
        f"<figure><img src='plots/{stem}.png' alt='{e(caption)}'>"
        f"<figcaption>{e(caption)} (<a href='plots/{stem}.svg'>SVG</a>)</figcaption></figure>"
    )


def _environment(rows: list[dict]) -> str:
    e = html.escape
    items = []
    networks = Counter(_network_words(r) for r in rows)
    if networks:
        items.append("<li>network: " + "; ".join(e(v) for v in networks) + "</li>")
    for column, title in (("kolo_commit", "kolo commit"), ("hosts", "hosts")):
        values = Counter(r[column] for r in rows if r[column])
        if values:
            items.append(f"<li>{title}: " + ", ".join(e(v) for v in values) + "</li>")
    hardware = Counter(_hardware(r) for r in rows)
    hardware.pop("", None)
    if hardware:
        items.append("<li>host hardware: " + "; ".join(e(v) for v in hardware) + "</li>")
    recorded = Counter(r["gpu_model"] for r in rows if r.get("compute") == "replay" and r["gpu_model"])
    if recorded:
        items.append("<li>replayed profile recorded on: " + ", ".join(e(v) for v in recorded) + "</li>")
    runs = Counter(r["run_id"] for r in rows if r["run_id"])
    if runs:
        items.append("<li>runs: " + ", ".join(e(v) for v in runs) + "</li>")
    return "<ul>" + "".join(items) + "</ul>" if items else ""


def _hardware(row: dict) -> str:
    """What the row's ranks ran on: rank 0's CPU and cores, and the GPU only where they computed
    on one. Under replay the record's gpu_model is the device the profile was recorded on, and a
    prediction ran on nothing."""
    parts = []
    cores = row.get("cpu_cores")
    if row.get("cpu_model"):
        parts.append(f"CPU {row['cpu_model']}" + (f" ({cores} cores)" if cores else ""))
    elif cores:
        parts.append(f"{cores} CPU cores")
    if row.get("gpu_model") and row.get("compute") not in ("replay", "simulated"):
        parts.append(f"GPU {row['gpu_model']}")
    return ", ".join(parts)


def _network_words(row: dict) -> str:
    """How a row's ranks were connected, in words."""
    network = row.get("network") or "loopback"
    if network == "emulated":
        text = f"emulated (scripts/cluster): {row.get('link', '')} links"
        if row.get("ranks_per_host"):
            text += f", {row['ranks_per_host']} rank(s) per host"
        if row.get("delay_us") not in ("", "0", None):
            text += f", {row['delay_us']} µs one-way delay"
        if row.get("dilation") not in ("", "1", None):
            text += f", dilation {row['dilation']}: stands for {row.get('link_represented', '')} links"
        return text
    if network == "loopback":
        return "loopback on one host"
    return "the hosts' own network"


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _config_cells(p: Point, cols: list[str]) -> list[str]:
    e = html.escape
    cells = []
    for c in cols:
        v = p.config.get(c, "")
        if c == "compute" and v == "replay":
            cells.append("<td class='text'><span class='replay'>replay</span></td>")
        elif c == "backend" and p.is_baseline:
            cells.append(f"<td class='text'>{e(v)} <span class='base'>single-rank baseline</span></td>")
        else:
            cells.append(f"<td class='text'>{e(v)}</td>")
    if "compute" not in cols and p.replay:
        cells[0] = f"<td class='text'>{e(p.config.get('model', ''))} <span class='replay'>replay</span></td>"
    return cells


def _table_columns(points: list[Point]) -> list[str]:
    cols = ["model"] + efficiency.varying(points, exclude=("model",))
    if "profile" in cols and len({(p.config["model"], p.config["profile"]) for p in points}) == len(
        {p.config["model"] for p in points}
    ):
        cols.remove("profile")  # one profile per model: the model says it
    return cols


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _summary_table(points: list[Point]) -> str:
    e = html.escape
    cols = _table_columns(points)
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    head += (
        "<th>ranks</th><th>nodes</th><th>images/sec</th><th>±</th><th>per GPU</th>"
        "<th>scaling efficiency<br><small>vs 1 rank without distribution</small></th>"
        "<th>efficiency vs own smallest rank count</th><th>ok</th><th>failed</th>"
    )
    body = []
    for p in points:
        cells = _config_cells(p, cols)
        own = _pct(p.own_efficiency)
        if own and p.base_ranks is not None:
            own += f" (vs {p.base_ranks})"
        cells.append(
            f"<td>{p.ranks}</td><td>{e(p.nodes)}</td><td>{_fmt(p.total, '.1f')}</td>"
            f"<td>{_fmt(p.total_spread, '.1f')}</td><td>{_fmt(p.per_rank, '.1f')}</td>"
            f"<td>{_pct(p.efficiency)}</td><td>{e(own)}</td><td>{p.ok}</td>"
            f"<td class='{'failed' if p.failed else ''}'>{p.failed}</td>"
        )
        body.append("<tr>" + "".join(cells) + "</tr>")
    return "<h2>Results</h2><table><tr>" + head + "</tr>" + "".join(body) + "</table>"


# What each backend's communication is called in the sentences.
_EXPOSED = {"ps": "waiting on the parameter servers"}
_MOVER = {"ring": "the ring", "mpi": "MPI", "nccl": "NCCL", "ps": "the parameter-server traffic"}
# Negotiation is named in a sentence once it takes this share of the step.
NEGOTIATION_NOTE = 0.10


def _step_ms(b: dict) -> float:
    step = b.get("step_time_ms_mean") or 0.0
    return step if step > 0 else sum(b[c] for c in schema.PHASES)


def dominant_cause(p: Point) -> str | None:
    """What most of the point's step went to: "compute" (forward, backward and update), "exposed
    allreduce" (blocked on collectives after backward), "parameter-server wait" (the same for
    backend ps), or "negotiation" (communication-bound, and agreeing on ready tensors is at least
    half of the time communicating). None without a breakdown."""
    if not plots.has_breakdown(p):
        return None
    b = p.breakdown
    compute = b["forward_ms"] + b["backward_ms"] + b["update_ms"]
    exposed = b["exposed_comm_ms"]
    if p.is_baseline or exposed <= compute:
        return "compute"
    comm = max(b.get("comm_ms", 0.0), exposed)
    if b.get("negotiation_ms", 0.0) >= 0.5 * comm:
        return "negotiation"
    return "parameter-server wait" if p.config.get("backend") == "ps" else "exposed allreduce"


def _bytes(nbytes: float) -> str:
    """GB (1e9 bytes) with two decimals; MB (1e6) or kB (1e3) below 0.01 GB."""
    if nbytes >= 1e7:
        return f"{nbytes / 1e9:.2f} GB"
    if nbytes >= 1e4:
        return f"{nbytes / 1e6:.2g} MB"
    return f"{nbytes / 1e3:.2g} kB"


def _rate(gbytes_per_sec: float) -> str:
    if gbytes_per_sec >= 0.01:
        return f"{gbytes_per_sec:.2f} GB/s"
    return f"{gbytes_per_sec * 1e3:.2g} MB/s"


def _share(x: float, step: float) -> str:
    return f"{100 * x / step:.0f}%" if step > 0 else "?"


def sentence(p: Point, cols: list[str]) -> str | None:
    """One sentence on where the point's step went, naming its dominant cause (dominant_cause),
    for example "VGG-16, 4 ranks, ring: 81% of the step is exposed allreduce (compute 19%); the
    ring moved 2.10 GB/step per rank at 0.45 GB/s while communicating; scaling efficiency 31%."
    `cols` are the configuration columns that tell the model's configurations apart. None without
    a breakdown."""
    cause = dominant_cause(p)
    if cause is None:
        return None
    b = p.breakdown
    step = _step_ms(b)
    compute = b["forward_ms"] + b["backward_ms"] + b["update_ms"]
    exposed = b["exposed_comm_ms"]
    negotiation = b.get("negotiation_ms", 0.0)
    replay = " (replay)" if p.replay else ""
    model = plots.model_name(p.config.get("model", ""))
    if p.is_baseline:
        return (
            f"{model}, 1 rank without distribution (the baseline){replay}: {step:.1f} ms per step, "
            f"{_share(compute, step)} compute (forward {_share(b['forward_ms'], step)}, backward "
            f"{_share(b['backward_ms'], step)}, update {_share(b['update_ms'], step)}); "
            f"{_fmt(p.total, '.1f')} images/sec, the denominator of this model's scaling efficiency."
        )
    name = efficiency.label(p.config, cols)
    if p.replay and "replay" not in name:
        name += " (replay)"
    backend = p.config.get("backend", "")
    what = _EXPOSED.get(backend, "exposed allreduce")
    head = f"{model}, {p.ranks} rank{'s' if p.ranks != 1 else ''}, {name}"
    if cause == "compute":
        text = (
            f"{_share(compute, step)} of the step is compute (forward, backward, update"
            f"{', replayed' if p.replay else ''}), {_share(exposed, step)} {what}"
        )
        hidden = b.get("hidden_comm_ms", 0.0)
        if hidden >= 0.05:
            text += f", {hidden:.1f} ms of communication hidden under backward"
    elif cause == "negotiation":
        text = (
            f"{_share(exposed, step)} of the step is {what}, most of it negotiation: "
            f"{_share(negotiation, step)} of the step goes to agreeing which tensors are ready"
        )
    else:
        text = f"{_share(exposed, step)} of the step is {what} (compute {_share(compute, step)})"
    if cause != "negotiation" and step > 0 and negotiation >= NEGOTIATION_NOTE * step:
        text += f"; negotiation takes {_share(negotiation, step)} of the step"
    nbytes, comm = b.get("comm_bytes_per_step", 0.0), b.get("comm_ms", 0.0)
    if nbytes > 0 and comm > 0:
        sent, rate = _bytes(nbytes), _rate(b.get("comm_gbytes_per_sec") or nbytes / comm / 1e6)
        if backend == "ps":
            text += f"; each rank sent {sent}/step to the parameter servers at {rate}"
        elif backend in ("mpi", "nccl"):
            text += (
                f"; {_MOVER[backend]} moved about {sent}/step per rank (estimated from the payload) at {rate}"
            )
        else:
            text += f"; {_MOVER.get(backend, backend)} moved {sent}/step per rank at {rate}"
        text += " while communicating"
    if p.efficiency is not None:
        text += f"; scaling efficiency {100 * p.efficiency:.0f}%"
    return f"{head}: {text}."


def sentences(points: list[Point]) -> list[str]:
    """sentence() for every point with a breakdown, in the points' order."""
    out = []
    for model in dict.fromkeys(p.config.get("model", "") for p in points):
        mine = [p for p in points if p.config.get("model", "") == model]
        cols = plots.sentence_columns(mine)
        out += [s for p in mine if (s := sentence(p, cols)) is not None]
    return out


def _time_section(points: list[Point]) -> str:
    e = html.escape
    found = sentences(points)
    if not found:
        if any(p.total is not None for p in points):
            return (
                "<h2>Where the time went</h2><p>This data holds no time breakdown (it was recorded "
                "before kolo-train reported one).</p>"
            )
        return ""
    return (
        "<h2>Where the time went</h2><p>Per training step, mean over the timed steps and the ranks. "
        "GB = 10<sup>9</sup> bytes (MB = 10<sup>6</sup>, kB = 10<sup>3</sup>) sent by each rank per "
        "step; GB/s = those bytes over the time the rank was communicating.</p><ul class='why'>"
        + "".join(f"<li>{e(s)}</li>" for s in found)
        + "</ul>"
    )


_BREAKDOWN_HEAD = (
    ("step_time_ms_mean", "step ms"),
    ("forward_ms", "forward ms"),
    ("backward_ms", "backward ms"),
    ("exposed_comm_ms", "exposed comm ms"),
    ("update_ms", "update ms"),
    ("comm_ms", "comm ms"),
    ("hidden_comm_ms", "hidden comm ms"),
    ("negotiation_ms", "negotiation ms"),
)


def _breakdown_table(points: list[Point]) -> str:
    e = html.escape
    shown = [p for p in points if plots.has_breakdown(p)]
    if not shown:
        return ""
    cols = _table_columns(points)
    head = "".join(f"<th>{e(c)}</th>" for c in cols) + "<th>ranks</th>"
    head += "".join(f"<th>{e(t)}</th>" for _, t in _BREAKDOWN_HEAD)
    head += "<th>GB/step per rank</th><th>GB/s communicating</th>"
    body = []
    for p in shown:
        b = p.breakdown
        cells = _config_cells(p, cols) + [f"<td>{p.ranks}</td>"]
        cells += [f"<td>{_fmt(b.get(c), '.2f')}</td>" for c, _ in _BREAKDOWN_HEAD]
        nbytes = b.get("comm_bytes_per_step")
        cells.append(f"<td>{_fmt(None if nbytes is None else nbytes / 1e9, '.3g')}</td>")
        cells.append(f"<td>{_fmt(b.get('comm_gbytes_per_sec'), '.3g')}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        "<h2>Time per step</h2><p>ms per training step, mean over the timed steps and the ranks. "
        "Forward + backward + exposed comm + update make up the step; comm is the time the engine "
        "was communicating (for ps: with a push-pull in flight), of which hidden comm overlapped "
        "backward.</p><table><tr>" + head + "</tr>" + "".join(body) + "</table>"
    )


def _pairs(points: list[Point], column: str, better: str, worse: str) -> list[tuple[Point, Point]]:
    """(point with `better`, point with `worse`) for each pair that differs only in `column`.
    ps-only settings are ignored when pairing ring with ps, so every ps variant is compared with
    the one ring point."""
    ignore = {column} | (set(settings.PS_ONLY) if column == "backend" else set())

    def key(p: Point) -> tuple:
        return tuple((k, v) for k, v in sorted(p.config.items()) if k not in ignore) + (p.ranks,)

    best = {key(p): p for p in points if p.total and p.config.get(column) == better}
    out = []
    for q in points:
        p = best.get(key(q))
        if q.total and q.config.get(column) == worse and p is not None:
            out.append((p, q))
    return out


def ratios(points: list[Point], column: str, better: str, worse: str) -> list[tuple[dict, int, float]]:
    """(configuration without `column`, ranks, images/sec with `better` over with `worse`) for
    each pair of points that differ only in `column` (_pairs)."""
    return [(q.config, q.ranks, p.total / q.total) for p, q in _pairs(points, column, better, worse)]


def _ratio_tables(points: list[Point]) -> str:
    e = html.escape
    parts = []
    for column, better, worse, title in (
        ("backend", "ring", "ps", "ring-allreduce over parameter server"),
        ("transport", "rdma", "tcp", "RDMA over TCP"),
    ):
        found = _pairs(points, column, better, worse)
        if not found:
            continue
        rows = []
        for p, q in found:
            extra = ""
            if column == "backend":
                servers, placement = q.config.get("ps_servers", ""), q.config.get("ps_placement", "")
                pacing = f", pacing={q.config['ps_pacing']}" if q.config.get("ps_pacing") else ""
                extra = f" (ps servers={servers}, placement={placement}{pacing})"
            replay = " <span class='replay'>replay</span>" if q.replay else ""
            rows.append(
                f"<tr><td class='text'>{e(q.config.get('model', ''))}{e(extra)}{replay}</td>"
                f"<td>{q.ranks}</td><td>{p.total / q.total:.2f}×</td>"
                f"<td>{_pct(p.efficiency)}</td><td>{_pct(q.efficiency)}</td>"
                f"<td>{_pct(p.own_efficiency)}</td><td>{_pct(q.own_efficiency)}</td></tr>"
            )
        parts.append(
            f"<h3>{e(title)}</h3><table><tr><th>model</th><th>ranks</th><th>speed-up</th>"
            f"<th>{e(better)} scaling efficiency</th><th>{e(worse)} scaling efficiency</th>"
            f"<th>{e(better)} efficiency vs own smallest rank count</th>"
            f"<th>{e(worse)} efficiency vs own smallest rank count</th></tr>" + "".join(rows) + "</table>"
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
