"""Every file the Python tools read goes through the bounded reader (reports/files.py), as the C++
side's does: a FIFO, a device such as /dev/zero, a directory or a file over the limit is refused at
once, naming it, and each tool exits with its bad-input status instead of blocking, growing without
bound or printing a traceback. FIFOs and devices are read only in subprocesses with a timeout and
a cap on memory, so that a regression fails the test instead of hanging it or filling the host's
memory from /dev/zero."""

import json
import os
import resource
import subprocess
import sys

import pytest
from reports import cli, files, gate, runner, schema, simvalidate, timelinefile

from conftest import FIXTURES, ROOT, need_mpirun

CSV = str(FIXTURES / "results.csv")
BASELINE = """
[[check]]
model = "resnet101"
ranks = 8
backend = "ring"
transport = "tcp"
fusion_threshold_mb = 64
efficiency = 0.87
"""
SWEEP = '[sweep]\nname = "files-test"\n[matrix]\nmodel = ["vgg16"]\nranks = [1]\n'
TIMEOUT_S = 10
MEMORY_CAP = 1 << 30  # address space of each tool run here: ample for it, far from the host's
KINDS = ("device", "fifo", "directory")
WHAT_IT_IS = {
    "device": "is a character device, not a regular file",
    "fifo": "is a FIFO, not a regular file",
    "directory": "is a directory, not a regular file",
}


def bad(tmp_path, kind, name="bad"):
    """A path of `kind` under tmp_path: /dev/zero (a link to it, where the name matters), a FIFO
    without a writer, or a directory."""
    path = tmp_path / name
    if kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    return str(path)


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_py(*args):
    """`python ARGS` with the repository on the path, as scripts/* run it; bounded in time and
    memory (an unbounded read of /dev/zero ends in a MemoryError, not in the host's OOM killer)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), KOLO_SKIP_BUILD="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        preexec_fn=_cap_memory,
    )


def run_cli(*args):
    """`python -m reports.cli ARGS`, as scripts/sweep, scripts/report and scripts/check-regression
    run it (run_py's bounds)."""
    return run_py("-m", "reports.cli", *args)


def refused(result, code, path, kind):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert f"'{path}' {WHAT_IT_IS[kind]}" in result.stderr, result.stderr
    assert "kolo reads only regular files" in result.stderr
    assert "Traceback" not in result.stderr


# --- the reader itself ------------------------------------------------------------------------


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes("ok é\n".encode())
    assert files.read_bytes(path, "test file", 100) == "ok é\n".encode()
    assert files.read_text(str(path), "test file", 100) == "ok é\n"
    assert files.read_text(path, "test file", len("ok é\n".encode())) == "ok é\n"  # limit inclusive


def test_a_device_is_refused_without_being_opened(monkeypatch):
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    with pytest.raises(files.FileRefused) as e:
        files.read_bytes("/dev/zero", "calibration", 64 << 20)
    assert str(e.value) == (
        "calibration '/dev/zero' is a character device, not a regular file: kolo reads only regular "
        "files (of at most 67108864 bytes)"
    )
    assert isinstance(e.value, OSError) and e.value.path == "/dev/zero"
    assert opened == []


def test_a_fifo_is_refused_at_once_with_or_without_a_writer(tmp_path):
    fifo = bad(tmp_path, "fifo")
    code = (
        "import sys; from reports import files\n"
        "try:\n"
        "    files.read_bytes(sys.argv[1], 'sweep file', 1024)\n"
        "except files.FileRefused as e:\n"
        "    print(e)\n"
    )
    result = run_py("-c", code, fifo)
    assert result.stdout.strip() == (
        f"sweep file '{fifo}' is a FIFO, not a regular file: kolo reads only regular files (of at most "
        "1024 bytes)"
    )
    # A writer that holds it open makes no difference.
    with open(os.open(fifo, os.O_RDWR), "wb"):
        result = run_py("-c", code, fifo)
    assert "is a FIFO, not a regular file" in result.stdout


def test_a_directory_a_larger_file_and_a_growing_one_are_refused(tmp_path):
    with pytest.raises(files.FileRefused, match=r"'.*' is a directory, not a regular file"):
        files.read_text(tmp_path, "baseline", 100)
    big = tmp_path / "big.csv"
    big.write_bytes(b"x" * 101)
    with pytest.raises(files.FileRefused) as e:
        files.read_bytes(big, "results CSV", 100)
    assert str(e.value) == f"results CSV '{big}' is 101 bytes, more than the 100 allowed"
    # /proc files say size 0: the limit holds on what is read.
    with pytest.raises(files.FileRefused) as e:
        files.read_bytes("/proc/self/status", "process status", 16)
    assert (
        str(e.value) == "process status '/proc/self/status' grew past the 16 bytes allowed while it was read"
    )
    assert b"Pid:" in files.read_bytes("/proc/self/status", "process status", files.PROC_LIMIT)


def test_bad_utf8_names_the_byte_and_a_missing_file_is_the_usual_oserror(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(files.NotUtf8) as e:
        files.read_text(path, "run record", 100)
    assert (e.value.byte, e.value.offset) == (0xE9, 13)
    assert str(e.value) == (
        f"run record '{path}' is not valid UTF-8 (byte 0xe9 at offset 13): kolo reads text files as UTF-8"
    )
    with pytest.raises(FileNotFoundError):
        files.read_text(tmp_path / "none", "run record", 100)
    with pytest.raises(files.FileRefused, match="the path is empty"):
        files.read_text("", "run record", 100)


# --- scripts/sweep ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_refuses_a_sweep_file_that_is_not_a_regular_file(tmp_path, kind):
    path = bad(tmp_path, kind, "sweep.toml")
    out = tmp_path / "out"
    result = run_cli("sweep", path, "--out", str(out))
    refused(result, 2, path, kind)
    assert f"sweep: 1 problem(s) in {path}:" in result.stderr
    assert not out.exists()


def test_sweep_refuses_a_sweep_file_over_the_limit(tmp_path, monkeypatch, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP)
    monkeypatch.setattr(files, "CONFIG_LIMIT", 10)
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"sweep file '{path}' is {len(SWEEP)} bytes, more than the 10 allowed" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_refuses_a_hostfile_that_is_not_a_regular_file(tmp_path, kind):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SWEEP)
    path = bad(tmp_path, kind, "hosts")
    result = run_cli("sweep", str(sweep), "--out", str(tmp_path / "out"), "--hostfile", path, "--dry-run")
    refused(result, 2, path, kind)
    assert "[launcher] hostfile" in result.stderr


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_sweep_refuses_a_results_csv_in_out_that_is_not_a_regular_file(tmp_path, kind):
    need_mpirun()
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SWEEP)
    out = tmp_path / "out"
    out.mkdir()
    path = bad(out, kind, "results.csv")
    result = run_cli("sweep", str(sweep), "--out", str(out), "--bin-dir", str(tmp_path))
    # A results.csv in --out that cannot be read is the sweep's exit 1, as a malformed one is.
    refused(result, 1, path, kind)
    assert not any((out / "points").iterdir())  # no point was started


def test_the_runner_reads_run_records_and_logs_through_the_bounded_reader(tmp_path, monkeypatch):
    record = tmp_path / "record.json"
    assert runner._read_record(str(record)) == (None, f"wrote no JSON record ({record})")
    record.write_text(json.dumps({"status": "ok"}))
    assert runner._read_record(str(record)) == ({"status": "ok"}, "")
    monkeypatch.setattr(files, "RECORD_LIMIT", 5)
    got, why = runner._read_record(str(record))
    assert got is None and "more than the 5 allowed" in why
    log = tmp_path / "log.txt"
    log.write_text("error: something broke\n")
    assert runner._log_text(str(log))[0] == ""
    assert "more than the 5 allowed" in runner._log_text(str(log))[1]


@pytest.mark.parametrize("kind", KINDS)
def test_the_runner_refuses_a_record_or_log_that_is_not_a_regular_file(tmp_path, kind):
    path = bad(tmp_path, kind, "record.json")
    code = (
        "import sys; from reports import runner\n"
        "print(runner._read_record(sys.argv[1])[1])\n"
        "print(runner._log_text(sys.argv[1])[1])\n"
        "print(runner._record_from_log(sys.argv[1])[1])\n"
    )
    result = run_py("-c", code, path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(f"'{path}' {WHAT_IT_IS[kind]}" in line for line in lines), lines


# --- scripts/check-regression -----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_check_regression_refuses_a_baseline_that_is_not_a_regular_file(tmp_path, kind):
    path = bad(tmp_path, kind, "baseline.toml")
    result = run_cli("check-regression", CSV, "--baseline", path)
    refused(result, 2, path, kind)
    assert result.stderr.startswith("check-regression: baseline ")


@pytest.mark.parametrize("kind", KINDS)
def test_check_regression_refuses_a_csv_that_is_not_a_regular_file(tmp_path, kind):
    baseline = tmp_path / "baseline.toml"
    baseline.write_text(BASELINE)
    path = bad(tmp_path, kind, "results.csv")
    result = run_cli("check-regression", path, "--baseline", str(baseline))
    refused(result, 2, path, kind)
    result = run_cli("check-regression", path, "--write-baseline", str(tmp_path / "new.toml"))
    refused(result, 2, path, kind)
    assert not (tmp_path / "new.toml").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_check_regression_refuses_a_bench_json_that_is_not_a_regular_file(tmp_path, kind):
    baseline = tmp_path / "baseline.toml"
    baseline.write_text(BASELINE)
    path = bad(tmp_path, kind, "bench.json")
    result = run_cli("check-regression", CSV, "--baseline", str(baseline), "--bench", path)
    refused(result, 2, path, kind)


def test_check_regression_refuses_files_over_their_limits(tmp_path, monkeypatch, capsys):
    baseline = tmp_path / "baseline.toml"
    baseline.write_text(BASELINE)
    assert cli.main(["check-regression", CSV, "--baseline", str(baseline)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(files, "CONFIG_LIMIT", 10)
    assert cli.main(["check-regression", CSV, "--baseline", str(baseline)]) == 2
    err = capsys.readouterr().err
    assert f"baseline '{baseline}' is {len(BASELINE)} bytes, more than the 10 allowed" in err
    monkeypatch.undo()
    monkeypatch.setattr(files, "RECORD_LIMIT", 10)
    assert cli.main(["check-regression", CSV, "--baseline", str(baseline)]) == 2
    assert (
        f"results CSV '{CSV}' is {os.path.getsize(CSV)} bytes, more than the 10 allowed"
        in capsys.readouterr().err
    )
    with pytest.raises(gate.BaselineError, match="more than the 10 allowed"):
        gate.load_bench(CSV)


# --- scripts/sim-validate ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["predicted", "measured"])
def test_sim_validate_refuses_inputs_that_are_not_regular_files(tmp_path, kind, which):
    path = bad(tmp_path, kind, f"{which}.csv")
    args = [path, CSV] if which == "predicted" else [CSV, path]
    result = run_py("-m", "reports.simvalidate", *args)
    refused(result, 2, path, kind)
    assert result.stderr.startswith(f"sim-validate: {which} CSV ")


def test_sim_validate_refuses_a_missing_or_oversized_input(tmp_path, monkeypatch, capsys):
    assert simvalidate.main([str(tmp_path / "none.csv"), CSV]) == 2
    assert f"sim-validate: {tmp_path / 'none.csv'} does not exist" in capsys.readouterr().err
    monkeypatch.setattr(files, "RECORD_LIMIT", 10)
    assert simvalidate.main([CSV, CSV]) == 2
    assert (
        f"predicted CSV '{CSV}' is {os.path.getsize(CSV)} bytes, more than the 10 allowed"
        in capsys.readouterr().err
    )


# --- scripts/report ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_report_refuses_a_results_csv_that_is_not_a_regular_file(tmp_path, kind):
    path = bad(tmp_path, kind, "results.csv")
    result = run_cli("report", str(tmp_path))
    refused(result, 2, path, kind)
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_report_refuses_a_predicted_csv_that_is_not_a_regular_file(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_bytes((FIXTURES / "results.csv").read_bytes())
    path = bad(tmp_path, kind, "predicted.csv")
    result = run_cli("report", str(out), "--predicted", path)
    refused(result, 2, path, kind)
    assert "--predicted CSV" in result.stderr
    assert not (out / "report").exists()


def test_report_refuses_a_folder_that_is_not_one_and_an_oversized_csv(tmp_path, monkeypatch, capsys):
    result = run_cli("report", "/dev/zero")
    assert result.returncode == 2 and "report: /dev/zero is not a folder" in result.stderr
    assert "Traceback" not in result.stderr
    (tmp_path / "results.csv").write_bytes((FIXTURES / "results.csv").read_bytes())
    monkeypatch.setattr(files, "RECORD_LIMIT", 10)
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"results CSV '{tmp_path / 'results.csv'}' is" in err and "more than the 10 allowed" in err
    assert not (tmp_path / "report").exists()


def test_a_results_csv_that_is_not_utf8_is_a_schema_error(tmp_path):
    path = tmp_path / "results.csv"
    path.write_bytes((FIXTURES / "results.csv").read_bytes() + b"caf\xe9\n")
    with pytest.raises(schema.SchemaError, match=r"is not valid UTF-8 \(byte 0xe9 at offset \d+\)"):
        schema.read_rows(str(path))


# --- scripts/timeline-merge and scripts/timeline-overlap --------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("script", ["timeline-merge", "timeline-overlap"])
def test_timeline_scripts_refuse_a_timeline_that_is_not_a_regular_file(tmp_path, kind, script):
    path = bad(tmp_path, kind, "timeline.json")
    args = ["--out", str(tmp_path / "merged.json"), path] if script == "timeline-merge" else [path]
    result = run_py(str(ROOT / "scripts" / script), *args)
    refused(result, 1, path, kind)  # these scripts' exit status for a file that cannot be read
    assert not (tmp_path / "merged.json").exists()


def test_a_timeline_over_the_limit_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps({"traceEvents": []}))
    assert timelinefile.load_events(str(path), "test") == []
    monkeypatch.setattr(files, "TIMELINE_LIMIT", 10)
    with pytest.raises(files.FileRefused, match="more than the 10 allowed"):
        timelinefile.load_events(str(path), "test")
