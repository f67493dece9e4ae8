"""The results CSV: its columns (documented in reports/SCHEMA.md), rows built from kolo-train's
JSON record, and reading and appending that survive a killed writer."""

from __future__ import annotations

import csv
import io
import os
import tempfile

from reports import files, settings

# Run metadata, then the settings (reports.settings order, ranks and nodes next to each other),
# then the results. Order is part of the schema.
META = (
    "run_id",
    "point_id",
    "repeat",
    "timestamp",
    "kolo_commit",
    "hosts",
    "cpu_model",
    "cpu_cores",
    "gpu_model",
)
SETTING_COLUMNS = (
    "model",
    "batch_size",
    "ranks",
    "nodes",
    "ranks_per_host",
    "network",
    "link",
    "link_represented",
    "delay_us",
    "flow_cap",
    "backend",
    "transport",
    "allreduce",
    "framework",
    "allreduce_algorithm",
    "compression",
    "tcp_streams",
    "autotune",
    "compute",
    "profile",
    "calibration",
    "gpu_rate",
    "step_jitter",
    "dilation",
    "precision",
    "fusion_threshold_mb",
    "cycle_time_ms",
    "backward_passes_per_step",
    "ps_servers",
    "ps_placement",
    "ps_hosts",
    "ps_pacing",
    "image_size",
    "num_classes",
    "num_warmup_batches",
    "num_batches",
)
RESULTS = (
    "total_images_per_sec",
    "images_per_sec_per_rank",
    "images_per_sec_stddev",
    "step_time_ms_median",
    "step_time_ms_mean",
    "forward_ms",
    "backward_ms",
    "exposed_comm_ms",
    "update_ms",
    "comm_ms",
    "hidden_comm_ms",
    "negotiation_ms",
    "comm_bytes_per_step",
    "comm_gbytes_per_sec",
    "collectives_per_step",
    "cycles_per_step",
    "cycle_hold_ms",
    # kolo-sim's split of exposed_comm_ms by cause (empty for measured runs; docs/kolo-sim.md).
    "exposed_coordination_ms",
    "exposed_latency_ms",
    "exposed_host_ms",
    "exposed_wire_ms",
    "final_loss",
    "kernel_share",
    "scaling_efficiency",
    "baseline_images_per_sec",
    "efficiency_vs_own_base",
    "efficiency_base_ranks",
    "duration_s",
    "host_other_cores",
    "status",
    "error",
    "log",
)
# Where each step's time went (kolo-train's record, per step, mean over the timed steps and the
# ranks). The first four are consecutive phases of a step: they add up to step_time_ms_mean.
PHASES = ("forward_ms", "backward_ms", "exposed_comm_ms", "update_ms")
BREAKDOWN = (
    "step_time_ms_mean",
    *PHASES,
    "comm_ms",
    "hidden_comm_ms",
    "negotiation_ms",
    "comm_bytes_per_step",
    "comm_gbytes_per_sec",
    "collectives_per_step",
    "cycles_per_step",
    "cycle_hold_ms",
)
COLUMNS = META + SETTING_COLUMNS + RESULTS
# How the ranks were connected (the "network" column): every rank on this host over loopback
# ("loopback"), an emulated network of namespaces and shaped links on this host ("emulated",
# scripts/cluster), the network of the hosts mpirun was given ("physical"), or none: a prediction
# of kolo-sim ("simulated", [launcher] kind = "sim"; its compute column says "simulated").
NETWORKS = ("loopback", "emulated", "physical", "simulated")
# The columns a results file gained with emulated networks and time dilation, and what they hold
# for the rows of an earlier file, which never had either.
NETWORK_COLUMNS = ("ranks_per_host", "network", "link", "link_represented", "delay_us", "dilation")
# The columns a results file gained with kolo-sim's predictions (empty in measured rows).
SIM_COLUMNS = settings.SIM_SETTINGS
NUMERIC = (
    "repeat",
    "cpu_cores",
    "batch_size",
    "ranks",
    "nodes",
    "ranks_per_host",
    "delay_us",
    "gpu_rate",
    "step_jitter",
    "dilation",
    "fusion_threshold_mb",
    "cycle_time_ms",
    "backward_passes_per_step",
    "ps_servers",
    "image_size",
    "num_classes",
    "num_warmup_batches",
    "num_batches",
    "total_images_per_sec",
    "images_per_sec_per_rank",
    "images_per_sec_stddev",
    "step_time_ms_median",
    *BREAKDOWN,
    "final_loss",
    "kernel_share",
    "scaling_efficiency",
    "baseline_images_per_sec",
    "efficiency_vs_own_base",
    "efficiency_base_ranks",
    "duration_s",
    "host_other_cores",
)
STATUSES = ("ok", "failed")
_RESULT_FIELDS = (
    "total_images_per_sec",
    "images_per_sec_per_rank",
    "images_per_sec_stddev",
    "step_time_ms_median",
    *BREAKDOWN,
    "exposed_coordination_ms",
    "exposed_latency_ms",
    "exposed_host_ms",
    "exposed_wire_ms",
    "final_loss",
    "kernel_share",
)

assert {s.csv_column for s in settings.SETTINGS} <= set(SETTING_COLUMNS), "a sweep setting lacks a CSV column"


class SchemaError(Exception):
    """A CSV that is not a kolo results file (wrong header, bad value)."""


def cell(value) -> str:
    """One CSV cell: numbers without float noise, lists joined with ';', None empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else repr(value)
    if isinstance(value, (list, tuple)):
        return ";".join(str(v) for v in value)
    return " ".join(str(value).split())  # one line: errors may hold newlines


def make_row(
    point: dict,
    record: dict | None,
    *,
    run_id: str,
    status: str,
    error: str = "",
    nodes: int | None = None,
    duration_s: float | None = None,
    host_other_cores: float | None = None,
    log: str = "",
    network: str = "loopback",
    cpu_cores: int | None = None,
) -> dict:
    """A CSV row for a finished point. Settings come from kolo-train's record where it has them
    (what actually ran) and from the point otherwise; results only from the record. `network` is
    one of NETWORKS; an emulated one takes its link, delay and ranks per host from the point.
    `cpu_cores`: the cores of the machine the ranks ran on, None where that is not this one."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r}; allowed: {STATUSES}")
    if network not in NETWORKS:
        raise ValueError(f"network {network!r}; allowed: {NETWORKS}")
    record = record or {}
    rec_settings = record.get("settings") or {}
    results = record.get("results") or {}
    row = {c: "" for c in COLUMNS}
    row.update(
        run_id=run_id,
        point_id=point["point_id"],
        repeat=point.get("repeat", 0),
        timestamp=record.get("timestamp", ""),
        kolo_commit=record.get("kolo_commit", ""),
        hosts=record.get("hosts", []),
        cpu_model=record.get("cpu_model", ""),
        cpu_cores=cpu_cores,
        gpu_model=record.get("gpu_model", ""),
    )
    merged = {k: v for k, v in rec_settings.items() if v is not None}
    merged.update({k: v for k, v in point.items() if k in SETTING_COLUMNS})
    if rec_settings.get("autotune") is True:
        # What the timed steps ran: the search's choice, whatever the point started from.
        merged["autotune"] = "on"
        for k in ("fusion_threshold_mb", "cycle_time_ms", "allreduce_algorithm"):
            if rec_settings.get(k) is not None:
                merged[k] = rec_settings[k]
        # Hierarchical allreduce is a knob where the hosts allow: the ring layout it chose.
        if rec_settings.get("hierarchical_allreduce") is not None:
            merged["allreduce"] = "hierarchical" if rec_settings["hierarchical_allreduce"] else "flat"
    elif merged.get("autotune") is False:
        merged["autotune"] = "off"
    for name in SETTING_COLUMNS:
        setting = settings.BY_NAME.get(name)
        if setting is None or setting.applies is None or setting.applies(merged):
            row[name] = merged.get(name)
    if not row["nodes"]:
        row["nodes"] = rec_settings.get("nodes") or nodes
    if row.get("flow_cap") == "off":
        row["flow_cap"] = None  # uncapped reads the same however it was asked for
    if row["ps_pacing"] == "off":
        row["ps_pacing"] = None  # unpaced reads the same however it was asked for
    # kolo-train runs undilated unless told: a record or point without it ran at dilation 1.
    if row["dilation"] in (None, ""):
        row["dilation"] = 1
    row["network"] = network
    if network not in ("emulated", "simulated"):
        for name in ("ranks_per_host", "link", "delay_us", "flow_cap"):
            row[name] = None
    if network == "simulated":
        row["compute"] = "simulated"
        row["delay_us"] = None
    if network in ("emulated", "simulated") and row["link"]:
        row["link_represented"] = settings.represented_link(row["link"], float(row["dilation"]))
    if status == "ok":
        for name in _RESULT_FIELDS:
            row[name] = results.get(name)
    row.update(status=status, error=error, duration_s=duration_s, host_other_cores=host_other_cores, log=log)
    return {k: cell(v) for k, v in row.items()}


def read_rows(path: str, what: str = "results CSV") -> list[dict]:
    """The rows of a results CSV as dicts of strings. A missing file has no rows; a last line cut
    short by a killed writer is dropped. Raises SchemaError on a header that is not COLUMNS, and on
    a file that cannot be read (reports.files: a FIFO, a device, a directory, one too large, not
    UTF-8; `what` names the file in that error)."""
    if not os.path.exists(path):
        return []
    text = _read(path, what)
    if not text.strip():
        return []
    complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(complete))
    header = tuple(reader.fieldnames or ())
    if header != COLUMNS and not is_older_header(header):
        raise SchemaError(
            f"{path}: header is not kolo's results schema (reports/SCHEMA.md); "
            f"got {reader.fieldnames}, expected {list(COLUMNS)}"
        )
    rows = []
    for row in reader:
        if None in row or any(v is None for v in row.values()):
            raise SchemaError(f"{path}: line {reader.line_num} has {len(row)} cells, expected {len(header)}")
        # An earlier kolo's file: the columns it lacks are "not measured", but for what its rows
        # must have been (no emulated network, no dilation).
        full = {c: row.get(c, "") for c in COLUMNS}
        if header != COLUMNS:
            full.update(_older_defaults(full, header))
        rows.append(full)
    return rows


def _older_defaults(row: dict, header: tuple[str, ...]) -> dict:
    """The network columns of a row from a file written before they existed: every rank on one
    host is loopback, more hosts were mpirun's own (physical); nothing was dilated."""
    out = {}
    if "network" not in header:
        try:
            nodes = float(row.get("nodes") or 1)
        except ValueError:
            nodes = 1
        out["network"] = "loopback" if nodes <= 1 else "physical"
    if "dilation" not in header:
        out["dilation"] = "1"
    return out


# Columns every kolo results file has had; a file with them, in COLUMNS' order and nothing else,
# was written by an earlier kolo (before the time breakdown or the network columns, for one) and
# reads with the missing columns empty (the network columns: _older_defaults).
# Settings added after the network columns: ps_hosts, ps_pacing, allreduce_algorithm,
# compression, tcp_streams; run metadata added later still.
_LATER_SETTINGS = (
    "ps_hosts",
    "ps_pacing",
    "allreduce_algorithm",
    "compression",
    "tcp_streams",
    "flow_cap",
    "autotune",
)
_LATER_META = ("cpu_cores",)
_ALWAYS = (
    tuple(c for c in META if c not in _LATER_META)
    + tuple(c for c in SETTING_COLUMNS if c not in NETWORK_COLUMNS + SIM_COLUMNS + _LATER_SETTINGS)
    + ("total_images_per_sec", "status", "error", "log")
)


def is_older_header(header: tuple[str, ...]) -> bool:
    """True when `header` is an earlier kolo's: some of COLUMNS, in order, with _ALWAYS among them.
    (Readers recompute the efficiency columns, so their values in such a file do not matter.)"""
    if not set(_ALWAYS) <= set(header) or not set(header) <= set(COLUMNS):
        return False
    order = [COLUMNS.index(c) for c in header]
    return order == sorted(order)


def header_of(path: str) -> tuple[str, ...]:
    """The header line of a CSV file, () when it is empty or missing."""
    if not os.path.exists(path):
        return ()
    return tuple(next(csv.reader(io.StringIO(_read(path), newline="")), ()))


def _read(path: str, what: str = "results CSV") -> str:
    """The text of a results CSV (reports.files' bounded reader), or SchemaError saying why not."""
    try:
        return files.read_text(path, what, files.RECORD_LIMIT)
    except files.FileRefused as e:
        raise SchemaError(str(e)) from None
    except OSError as e:
        raise SchemaError(f"{what} '{path}' cannot be read: {e.strerror}") from None


def append_row(path: str, row: dict) -> None:
    """Appends `row` and syncs it to disk before returning; writes the header to a new file.
    Repairs a last line cut short by a killed writer first."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    if not new:
        with open(path, "rb+") as f:
            data = f.read()
            if not data.endswith(b"\n"):
                f.seek(data.rfind(b"\n") + 1)
                f.truncate()
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    if new:
        writer.writeheader()
    writer.writerow({c: row.get(c, "") for c in COLUMNS})
    with open(path, "a", newline="") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())


def write_rows(path: str, rows: list[dict]) -> None:
    """Replaces the CSV at `path` with `rows` atomically (a reader sees the old or the new file)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".csv", dir=directory)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            for row in rows:
                writer.writerow({c: row.get(c, "") for c in COLUMNS})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def number(row: dict, column: str) -> float | None:
    """The value of a numeric column as a float, None when empty."""
    text = row.get(column, "")
    if text in ("", None):
        return None
    try:
        return float(text)
    except ValueError:
        raise SchemaError(
            f"column {column} holds {text!r}, not a number (point {row.get('point_id')})"
        ) from None


def latest_per_point(rows: list[dict]) -> list[dict]:
    """One row per point id, the last one written (a rerun of a failed point supersedes it)."""
    last: dict[str, dict] = {}
    for row in rows:
        last.pop(row["point_id"], None)
        last[row["point_id"]] = row
    return list(last.values())
