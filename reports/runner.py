"""Runs a sweep: each point under a timeout, one CSV row appended the moment it finishes.

Layout of the output folder:
  results.csv            one row per finished point (reports/SCHEMA.md)
  points/<id>/log.txt    the point's output (launcher and every rank)
  points/<id>/record.json  kolo-train's JSON record
  sweep.toml             a copy of the sweep file that ran last
  cluster.log            kind "cluster": every scripts/cluster command and its output
  network.txt            kind "cluster" run over loopback instead ([launcher] fallback): why
  report/                the report (reports.report)
A point whose id has a row in results.csv is skipped when the sweep runs again.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import io
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from reports import cluster, efficiency, files, hostload, launch, schema, settings, sweepfile
from reports.launchers import base
from reports.sweepfile import Sweep

RESULTS = "results.csv"
# Where a cluster sweep says why it ran over loopback instead (the report shows it).
FALLBACK_NOTE = "network.txt"
_ERROR_RE = re.compile(r"\b(error|failed|exception|what\(\))", re.IGNORECASE)
_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_MPIRUN_NOISE = re.compile(r"^(-{5,}|mpirun (detected|noticed)|Primary job|Prterun|\s*$)")


class Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@dataclass
class Outcome:
    ran: int = 0
    skipped: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)


class Progress:
    """A progress line per event on `stream`: a bar, done/total, elapsed time and an ETA from the
    mean duration of the points run so far."""

    def __init__(self, total: int, stream=sys.stderr, width: int = 24):
        self.total = total
        self.done = 0
        self.stream = stream
        self.width = width
        self.started = time.monotonic()
        self.durations: list[float] = []

    def eta_s(self) -> float | None:
        if not self.durations:
            return None
        return (sum(self.durations) / len(self.durations)) * (self.total - self.done)

    def bar(self) -> str:
        filled = int(self.width * self.done / self.total) if self.total else self.width
        pct = 100 * self.done / self.total if self.total else 100
        eta = self.eta_s()
        eta_text = _hms(eta) if eta is not None else "?"
        return (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {pct:3.0f}% "
            f"elapsed {_hms(time.monotonic() - self.started)} ETA {eta_text}"
        )

    def say(self, text: str) -> None:
        print(f"{self.bar()} | {text}", file=self.stream, flush=True)

    def finished(self, seconds: float | None, text: str) -> None:
        self.done += 1
        if seconds is not None:
            self.durations.append(seconds)
        self.say(text)


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id() -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(2)}"


def failure_text(log_text: str, returncode: int) -> str:
    """One line saying why a point failed: the first line of its log that reads like an error
    (mpirun's boilerplate skipped), else its last line, after the exit status."""
    lines = [ln.strip() for ln in log_text.splitlines() if not _MPIRUN_NOISE.match(ln)]
    lines = [ln for ln in lines if ln]
    pick = next((ln for ln in lines if _ERROR_RE.search(ln)), lines[-1] if lines else "no output")
    what = f"exit status {returncode}" if returncode >= 0 else f"killed by {signal.Signals(-returncode).name}"
    return f"{what}: {pick}"[:500]


def run(
    sweep: Sweep, out_dir: str, *, bin_dir: str, retry_failed: bool = False, stream=sys.stderr
) -> Outcome:
    """Runs every point of `sweep` that has no row in out_dir/results.csv yet (nor a failed one,
    with retry_failed). Raises Interrupted on SIGINT/SIGTERM after stopping the running point, and
    SweepError, before writing anything, when a point's folder would lie outside out_dir."""
    for point in sweep.points:
        sweep.under(out_dir, "points", point["point_id"])
    os.makedirs(os.path.join(out_dir, "points"), exist_ok=True)
    with open(os.path.join(out_dir, ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another sweep is writing to {out_dir}") from None
        return _run_locked(sweep, out_dir, bin_dir, retry_failed, stream)


def _run_locked(sweep: Sweep, out_dir: str, bin_dir: str, retry_failed: bool, stream) -> Outcome:
    csv_path = os.path.join(out_dir, RESULTS)
    done = {}
    rows = schema.read_rows(csv_path)
    for row in rows:
        done[row["point_id"]] = row["status"]
    if rows and schema.header_of(csv_path) != schema.COLUMNS:
        # An earlier kolo's file: rewritten in today's columns before rows are appended to it.
        schema.write_rows(csv_path, efficiency.with_efficiency(rows))
        print(f"sweep {sweep.name}: {csv_path} rewritten in today's columns (reports/SCHEMA.md)", file=stream)
    copy = files.read_bytes(sweep.path, "sweep file", files.CONFIG_LIMIT)
    with open(os.path.join(out_dir, "sweep.toml"), "wb") as f:
        f.write(copy)

    launcher = sweep.launcher
    program = launcher.program_path(bin_dir)
    kolo_run = os.path.join(bin_dir, "kolo-run")
    base.require_executable(program, launcher.PROGRAM_WHAT)
    launcher.require_tools(kolo_run)
    _check_transports(sweep, program, stream)

    todo = []
    outcome = Outcome()
    for point in sweep.points:
        status = done.get(point["point_id"])
        if status == "ok" or (status == "failed" and not retry_failed):
            outcome.skipped += 1
        else:
            todo.append(point)
    progress = Progress(len(todo), stream)
    for note in sweep.added:
        print(f"sweep {sweep.name}: {note}", file=stream)
    if outcome.skipped:
        print(f"sweep {sweep.name}: {outcome.skipped} point(s) already in {csv_path}, skipped", file=stream)
    run_id = new_run_id()
    session = None
    shapes = sweep.launcher.shapes(todo)
    if any(s is not None for s in shapes):
        session = cluster.Session(os.path.join(out_dir, "cluster.log"))
        print(
            f"sweep {sweep.name}: emulated cluster {session.name} (scripts/cluster; "
            f"log: {session.log_path}): " + "; ".join(dict.fromkeys(s.describe() for s in shapes)),
            file=stream,
        )
    previous = _install_handlers()
    try:
        with session or contextlib.nullcontext():
            run = (out_dir, run_id, program, kolo_run, csv_path)
            _run_points(sweep, todo, shapes, session, run, progress, outcome)
    finally:
        _restore_handlers(previous)
    # Now that every configuration's smallest rank count may have run, recompute efficiencies.
    rows = schema.read_rows(csv_path)
    if rows:
        schema.write_rows(csv_path, efficiency.with_efficiency(rows))
    return outcome


def _run_points(sweep, todo, shapes, session, run, progress, outcome) -> None:
    """Runs `todo` in order (each on its cluster shape, kind "cluster"), appending a row per point."""
    out_dir, run_id, program, kolo_run, csv_path = run
    for point, shape in zip(todo, shapes, strict=True):
        progress.say(f"running {sweep.label(point)}")
        row = _run_point(point, sweep, out_dir, run_id, program, kolo_run, session, shape)
        rows = schema.read_rows(csv_path) + [row]
        row = efficiency.with_efficiency(rows)[-1]
        # A signal now would leave half a row; hold it until the row is on disk.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            schema.append_row(csv_path, row)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        outcome.ran += 1
        seconds = float(row["duration_s"]) if row["duration_s"] else None
        if row["status"] == "ok":
            eff = f", efficiency {float(row['scaling_efficiency']):.2f}" if row["scaling_efficiency"] else ""
            result = f"ok {float(row['total_images_per_sec'] or 0):.1f} images/sec{eff}"
        else:
            outcome.failed += 1
            outcome.failures.append(f"{sweep.label(point)}: {row['error']}")
            result = f"FAILED {row['error']} (log: {os.path.join(out_dir, row['log'])})"
        progress.finished(seconds, f"{sweep.label(point)} -> {result}")
        if session is not None and row["status"] != "ok":
            # A failed point may have left the network in any state: the next starts afresh.
            session.down()


def _run_point(
    point: dict,
    sweep: Sweep,
    out_dir: str,
    run_id: str,
    program: str,
    kolo_run: str,
    session: cluster.Session | None = None,
    shape: cluster.Shape | None = None,
) -> dict:
    pid = point["point_id"]
    pdir = sweep.under(out_dir, "points", pid)
    os.makedirs(pdir, exist_ok=True)
    log_path = os.path.join(pdir, "log.txt")
    json_path = os.path.join(pdir, "record.json")
    for stale in (log_path, json_path):
        if os.path.exists(stale):
            os.unlink(stale)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    profile = sweepfile.profile_path(point, root) if "profile" in point else None
    open(log_path, "w").close()
    nodes = sweep.launcher.nodes(point)
    cluster_name = None
    if session is not None and shape is not None:
        started = time.monotonic()
        why = session.ensure(shape, log_path)
        if why is not None:
            return schema.make_row(
                point,
                None,
                run_id=run_id,
                status="failed",
                error=why,
                nodes=nodes,
                duration_s=round(time.monotonic() - started, 2),
                log=os.path.relpath(log_path, out_dir),
                network=sweep.launcher.network(),
            ) | {"timestamp": _now()}
        cluster_name = session.name
    argv = launch.command(
        point,
        sweep.launcher,
        program,
        kolo_run,
        json_path,
        sweep.timeout_s,
        profile,
        cluster_name=cluster_name,
        cluster_script=cluster.SCRIPT,
    )
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(_quote(a) for a in argv) + "\n")
    env = sweep.launcher.point_env(dict(os.environ))
    token = f"{run_id}-{pid}"
    # Stops the point's processes if this process is killed outright while it runs (started before
    # the point's clock, which it is not part of).
    guard = launch.point_guard(token)
    started = time.monotonic()
    load = hostload.HostLoad()
    clean = False
    try:
        # A signal between the launcher's start and the handler below would leave the launcher
        # running unstopped: hold it until the handler is in place.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            proc = launch.start(argv, env, log_path, token)
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            raise
        timed_out = False
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held signal is raised here
            proc.wait(timeout=sweep.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            launch.stop(proc, token)
        except BaseException:
            launch.stop(proc, token)
            with open(log_path, "a") as log:
                log.write("sweep: interrupted; every process of this point was stopped\n")
            raise
        leftovers = launch.reap_leftovers(token)
        clean = True
    finally:
        # Any other way out leaves the guard to stop whatever carries the point's token.
        guard.release(done=clean)
    if session is not None:
        leftovers += session.reap_leftovers()
    duration = time.monotonic() - started
    other_cores = load.other_cores()
    rel_log = os.path.relpath(log_path, out_dir)

    record, record_error = _read_record(json_path)
    if record is None and not os.path.exists(json_path):
        # Rank 0 ran on another host: its record came back with the output (--json-stdout).
        from_log, why = _record_from_log(log_path)
        if from_log is not None:
            record, record_error = from_log, ""
            with contextlib.suppress(OSError), open(json_path, "w") as f:
                json.dump(from_log, f, indent=2)
        elif why:
            record_error = why
    if timed_out:
        status, error = (
            "failed",
            f"timed out after {sweep.timeout_s:g} s ([sweep] timeout_s); every process stopped",
        )
    elif proc.returncode != 0:
        log_text, unread = _log_text(log_path)
        status, error = "failed", failure_text(log_text, proc.returncode)
        if unread:
            error = f"{error} ({unread})"[:500]
        if record and record.get("status") == "failed" and record.get("error"):
            error = f"exit status {proc.returncode}: {record['error']}"
    elif record is None:
        status, error = "failed", f"kolo-train exited 0 but {record_error}"
    elif record.get("status") != "ok":
        status, error = "failed", record.get("error") or f"record status {record.get('status')!r}"
    else:
        status, error = "ok", ""
    if leftovers and status == "ok":
        status, error = "failed", f"{leftovers} process(es) outlived the launcher and were killed"
    row = schema.make_row(
        point,
        record,
        run_id=run_id,
        status=status,
        error=error,
        nodes=nodes,
        duration_s=round(duration, 2),
        # A prediction does not depend on what else the host ran: no load to report or judge.
        host_other_cores=None
        if other_cores is None or sweep.launcher.network() == "simulated"
        else round(other_cores, 2),
        log=rel_log,
        network=sweep.launcher.network(),
        cpu_cores=os.cpu_count() if sweep.launcher.ranks_on_this_host() else None,
    )
    if not row["timestamp"]:
        row["timestamp"] = _now()
    return row


def _log_text(log_path: str) -> tuple[str, str]:
    """(the point's log as text, "") or ("", why it could not be read)."""
    try:
        data = files.read_bytes(log_path, "point log", files.RECORD_LIMIT)
    except files.FileRefused as e:
        return "", str(e)
    except OSError as e:
        return "", f"its log {log_path} cannot be read: {e.strerror}"
    return data.decode("utf-8", errors="replace"), ""


def _read_record(path: str) -> tuple[dict | None, str]:
    try:
        record = json.loads(files.read_text(path, "run record", files.RECORD_LIMIT))
    except FileNotFoundError:
        return None, f"wrote no JSON record ({path})"
    except files.FileRefused as e:
        return None, f"wrote an unreadable JSON record ({e})"
    except (OSError, json.JSONDecodeError) as e:
        return None, f"wrote an unreadable JSON record ({path}: {e})"
    if not isinstance(record, dict):
        return None, f"wrote a JSON record that is not an object ({path})"
    return record, ""


# Transports that need something of every host (a device), asked of each host before the first
# point so that a cluster without it gets one error, not a failed row per point.
CHECKED_TRANSPORTS = ("rdma",)
CHECK_TIMEOUT_S = 120.0


class TransportUnavailable(RuntimeError):
    """A transport the sweep uses cannot run on some of its hosts."""


def _check_transports(sweep: Sweep, program: str, stream) -> None:
    """Runs `kolo-train --check-transport` on every host the sweep's points use, once per checked
    transport; raises TransportUnavailable with what the hosts said when one cannot."""
    wanted = sorted({p["transport"] for p in sweep.points if p.get("transport") in CHECKED_TRANSPORTS})
    processes = max((settings.process_count(p) for p in sweep.points), default=1)
    for transport in wanted:
        argv = launch.check_command(sweep.launcher, program, transport, processes)
        if argv is None:
            continue  # the launcher's hosts are not checked (an emulated cluster, a prediction)
        env = {**os.environ, **sweep.launcher.env}
        print(f"sweep {sweep.name}: checking that every host can use transport {transport}", file=stream)
        try:
            done = subprocess.run(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=CHECK_TIMEOUT_S,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            raise TransportUnavailable(
                f"checking transport {transport} on the hosts took over {CHECK_TIMEOUT_S:g} s: "
                + " ".join(_quote(a) for a in argv)
            ) from None
        except OSError as e:
            raise TransportUnavailable(f"cannot check transport {transport}: {e}") from None
        if done.returncode != 0:
            said = [ln for ln in (done.stdout + done.stderr).splitlines() if "cannot use transport" in ln]
            said = said or (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise TransportUnavailable(
                f"transport {transport} cannot run on every host of this sweep, so none of its "
                f"{sum(p.get('transport') == transport for p in sweep.points)} {transport} point(s) "
                "is started:\n  " + "\n  ".join(said)
            )


RECORD_PREFIX = "kolo-record: "


def _record_from_log(log_path: str) -> tuple[dict | None, str]:
    """The last record kolo-train printed with --json-stdout in the point's output, or (None,
    why) when it printed one that cannot be read, or (None, "") when it printed none."""
    line = None
    text, unread = _log_text(log_path)
    if unread and os.path.exists(log_path):
        return None, f"its output could not be searched for a record: {unread}"
    for text_line in io.StringIO(text, newline=None):  # universal newlines, as reading the file did
        if text_line.startswith(RECORD_PREFIX):
            line = text_line[len(RECORD_PREFIX) :]
    if line is None:
        return None, ""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"printed an unreadable record in its output ({e})"
    if not isinstance(record, dict):
        return None, "printed a record that is not a JSON object"
    return record, ""


def _quote(arg: str) -> str:
    return arg if re.fullmatch(r"[\w@%+=:,./-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def _install_handlers():
    previous = {}
    for sig in _HANDLED:
        previous[sig] = signal.signal(sig, _raise_interrupted)
    return previous


def _restore_handlers(previous) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
