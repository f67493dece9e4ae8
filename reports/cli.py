"""Command lines behind scripts/sweep, scripts/report and scripts/check-regression.

    python -m reports.cli sweep FILE --out DIR [--bin-dir DIR] [--only KEY=V,...]... [--dry-run]
                                [--retry-failed] [--no-report]
    python -m reports.cli report DIR [--predicted CSV]
    python -m reports.cli check-regression CSV --baseline FILE [--bench JSON]...

Exit status: 0 success; 1 a point failed, the gate fell short, or something could not run;
2 a bad command line, sweep file, baseline or CSV; 128 + N when stopped by signal N.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from reports import browser, cluster, gate, launch, report, runner, schema, sweepfile
from reports.launch import command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kolo-sweeps", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("sweep", help="run a sweep file")
    p.add_argument("file", help="sweep file (TOML; format in sweeps/README.md)")
    p.add_argument("--out", required=True, help="results folder (results.csv, points/, report/)")
    p.add_argument(
        "--bin-dir",
        default=None,
        help="folder of kolo-train and kolo-run (default: $KOLO_BIN_DIR or build/bin, built first)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate, list every point's command line and placement, run nothing",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY=V[,V...]",
        help="run only the points whose matrix setting KEY is one of the values (repeatable: all must match)",
    )
    p.add_argument(
        "--hosts",
        metavar="H1:SLOTS,H2:SLOTS",
        help="the hosts to run on, replacing the file's [launcher] hosts or hostfile (kind mpirun)",
    )
    p.add_argument("--hostfile", metavar="FILE", help="an Open MPI hostfile, replacing the file's hosts")
    p.add_argument("--retry-failed", action="store_true", help="run points again whose row says failed")
    p.add_argument("--no-report", action="store_true", help="skip the report at the end")

    p = sub.add_parser("report", help="plots and an HTML page from a sweep folder")
    p.add_argument("dir", help="sweep folder holding results.csv")
    p.add_argument(
        "--predicted",
        metavar="CSV",
        help="kolo-sim's predictions of these points (a kind = sim sweep's results.csv): drawn "
        "beside the measurements, with each point's error",
    )

    p = sub.add_parser("check-regression", help="compare a results CSV with a baseline")
    p.add_argument("csv", help="results.csv of a sweep")
    p.add_argument("--baseline", help="baseline file (TOML; format in reports/README.md)")
    p.add_argument(
        "--bench",
        action="append",
        default=[],
        metavar="JSON",
        help="kolo-allreduce-bench --json output for the baseline's [[ring]] checks (repeatable)",
    )
    p.add_argument(
        "--write-baseline",
        metavar="FILE",
        help="instead of checking, record the CSV's efficiencies as a new baseline FILE",
    )
    p.add_argument("--min-efficiency", type=float, default=0.5, help="[defaults] of --write-baseline")
    p.add_argument("--max-drop", type=float, default=0.15, help="[defaults] of --write-baseline")

    args = parser.parse_args(argv)
    if args.command == "sweep":
        return _sweep(args)
    if args.command == "report":
        return _report(args.dir, args.predicted)
    return _check(args)


def _sweep(args) -> int:
    try:
        sweep = sweepfile.load(args.file, ROOT, hosts=args.hosts, hostfile=args.hostfile)
        if args.only:
            sweep = sweepfile.only(sweep, args.only)
    except sweepfile.SweepError as e:
        return _bad_sweep(e)
    # Absolute: on an emulated cluster the ranks start through other hosts' shells.
    bin_dir = os.path.abspath(
        args.bin_dir or os.environ.get("KOLO_BIN_DIR") or os.path.join(ROOT, "build", "bin")
    )
    args.out = os.path.abspath(args.out)
    sweep, fallback_note, problems = _network_here(sweep)
    if problems and not args.dry_run:
        print(f"sweep: {len(problems)} problem(s) in {sweep.path}:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    for problem in problems:  # a dry run lists the points all the same
        print(f"sweep {sweep.name}: here it would stop (exit 2): {problem}", file=sys.stderr)
    if fallback_note:
        print(f"sweep {sweep.name}: {fallback_note}", file=sys.stderr)
    if args.dry_run:
        try:
            _dry_run(sweep, args.out, bin_dir)
        except sweepfile.SweepError as e:
            return _bad_sweep(e)
        return 0
    if (
        not args.bin_dir
        and not os.environ.get("KOLO_BIN_DIR")
        and not sweep.launcher.program
        and os.environ.get("KOLO_SKIP_BUILD", "0") != "1"
    ):
        build = subprocess.run(
            [os.path.join(ROOT, "scripts", "build"), "--target", "kolo-train", "--target", "kolo-run"],
            stdin=subprocess.DEVNULL,
        )
        if build.returncode != 0:
            print("sweep: building kolo-train and kolo-run failed (scripts/build)", file=sys.stderr)
            return 1
    _note_fallback(args.out, fallback_note)
    try:
        outcome = runner.run(sweep, args.out, bin_dir=bin_dir, retry_failed=args.retry_failed)
    except runner.Interrupted as e:
        print(
            f"sweep: stopped by {e}; finished points are in {args.out}/results.csv, "
            "run the same command again to go on",
            file=sys.stderr,
        )
        return 128 + e.signum
    except runner.TransportUnavailable as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    except sweepfile.SweepError as e:  # a path out of the sweep file that would leave --out
        return _bad_sweep(e)
    except (OSError, RuntimeError, schema.SchemaError) as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 1
    print(
        f"sweep {sweep.name}: {outcome.ran} point(s) run, {outcome.skipped} skipped, "
        f"{outcome.failed} failed; results: {os.path.join(args.out, runner.RESULTS)}",
        file=sys.stderr,
    )
    status = 0
    if outcome.failed:
        for failure in outcome.failures:
            print(f"  failed: {failure}", file=sys.stderr)
        status = 1
    if not args.no_report:
        status = max(status, _report(args.out))
    if fallback_note:
        print(f"sweep {sweep.name}: {fallback_note}", file=sys.stderr)
    return status


def _bad_sweep(e: sweepfile.SweepError) -> int:
    print(f"sweep: {len(e.problems)} problem(s) in {e.path}:", file=sys.stderr)
    for problem in e.problems:
        print(f"  {problem}", file=sys.stderr)
    return 2


def _network_here(
    sweep: sweepfile.Sweep, found: cluster.Check | None = None
) -> tuple[sweepfile.Sweep, str | None, list[str]]:
    """(the sweep to run on this machine, a note on how it differs or None, the problems that
    stop it), as its launcher says (launcher.ready_here): a cluster sweep runs over loopback where
    no emulated network can be made (`found`: scripts/cluster check's answer, asked when None) and
    its [launcher] fallback allows it."""
    return sweep.launcher.ready_here(sweep, found)


def _note_fallback(out_dir: str, note: str | None) -> None:
    """Keeps (or clears) why this run went over loopback, for the report."""
    path = os.path.join(out_dir, runner.FALLBACK_NOTE)
    if note:
        os.makedirs(out_dir, exist_ok=True)
        with open(path, "w") as f:
            f.write(note + "\n")
    elif os.path.exists(path):
        os.unlink(path)


def _dry_run(sweep: sweepfile.Sweep, out_dir: str, bin_dir: str) -> None:
    """Lists every point with its id and command line; on an emulated cluster also the
    scripts/cluster commands that bring it up before the point (where its shape changes) and
    down at the end."""
    print(f"sweep {sweep.name}: {len(sweep.points)} point(s), timeout {sweep.timeout_s:g} s each")
    program = sweep.launcher.program or os.path.join(bin_dir, "kolo-train")
    shapes = sweep.launcher.shapes(sweep.points)
    name = cluster.new_name() if any(s is not None for s in shapes) else None
    current = None
    for point, shape in zip(sweep.points, shapes, strict=True):
        profile = sweepfile.profile_path(point, ROOT) if "profile" in point else None
        json_path = os.path.join(sweep.under(out_dir, "points", point["point_id"]), "record.json")
        argv = command(
            point,
            sweep.launcher,
            program,
            os.path.join(bin_dir, "kolo-run"),
            json_path,
            sweep.timeout_s,
            profile,
            cluster_name=name,
            cluster_script=cluster.SCRIPT,
        )
        print(f"{point['point_id']}  {sweepfile.describe(point)}")
        where = launch.placement_of(point, sweep.launcher)
        if where is not None:
            for line in where.lines:
                print(f"    placement {line}")
        if shape is not None and shape != current:
            if current is not None:
                print(f"    {cluster.SCRIPT} down --name {name}")
            print(f"    {' '.join(shape.up_argv(name))}")
            current = shape
        print(f"    {' '.join(argv)}")
    if current is not None:
        print(f"{cluster.SCRIPT} down --name {name}")


def _report(out_dir: str, predicted: str | None = None) -> int:
    try:
        path = report.build(out_dir, predicted)
    except FileNotFoundError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    except schema.SchemaError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}", file=sys.stderr)
    return _look_at(path)


def _look_at(html: str) -> int:
    """Opens the report in headless Chromium, when there is one, and keeps a full-page screenshot
    beside it (report/screenshot.png). 1 when an image does not load, a table is missing or the page
    logs an error; a browser that cannot run is only reported."""
    if browser.find_browser() is None:
        print(f"report: not looked at in a browser: {browser.why_missing()}", file=sys.stderr)
        return 0
    shot = os.path.join(os.path.dirname(html), "screenshot.png")
    try:
        seen = browser.check_report(html, shot)
    except browser.BrowserError as e:
        print(f"report: not looked at in a browser: {e}", file=sys.stderr)
        return 0
    for src in seen.broken:
        print(f"report: broken image in the browser: {src}", file=sys.stderr)
    for error in seen.console_errors:
        print(f"report: the browser logged: {error}", file=sys.stderr)
    loaded = len(seen.images) - len(seen.broken)
    print(
        f"report: in headless Chromium {loaded} of {len(seen.images)} images loaded, {seen.tables} "
        f"tables; screenshot {shot}",
        file=sys.stderr,
    )
    return 0 if seen.ok else 1


def _check(args) -> int:
    if args.write_baseline:
        return _write_baseline(args)
    if not args.baseline:
        print("check-regression: --baseline FILE is required (or --write-baseline FILE)", file=sys.stderr)
        return 2
    try:
        baseline = gate.load(args.baseline)
        rows = schema.read_rows(args.csv)
        benches = [gate.load_bench(path) for path in args.bench]
    except (gate.BaselineError, schema.SchemaError) as e:
        print(f"check-regression: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.csv):
        print(f"check-regression: {args.csv} does not exist", file=sys.stderr)
        return 2
    verdicts = gate.evaluate(rows, baseline.checks) + gate.evaluate_rings(benches, baseline.rings)
    failed = [v for v in verdicts if not v.ok]
    unjudged = [v for v in verdicts if not v.judged]
    print(gate.table(verdicts))
    if unjudged:
        print(
            f"\ncheck-regression: {len(unjudged)} time-based check(s) not judged: other work kept the "
            "host busy during those points (host_other_cores)"
        )
    if failed:
        print(f"\ncheck-regression: {len(failed)} of {len(verdicts)} check(s) fell short of {args.baseline}:")
        print(gate.table(failed))
        return 1
    judged = len(verdicts) - len(unjudged)
    print(f"\ncheck-regression: all {judged} judged check(s) passed against {args.baseline}")
    return 0


def _write_baseline(args) -> int:
    try:
        rows = schema.read_rows(args.csv)
    except schema.SchemaError as e:
        print(f"check-regression: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"check-regression: {args.csv} has no rows", file=sys.stderr)
        return 2
    header = f"# Recorded from {args.csv} by scripts/check-regression --write-baseline.\n"
    text = gate.baseline_text(rows, args.min_efficiency, args.max_drop, header)
    with open(args.write_baseline, "w") as f:
        f.write(text)
    print(f"check-regression: wrote {args.write_baseline}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader of a listing went away (| head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
