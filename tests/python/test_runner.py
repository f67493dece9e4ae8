"""The sweep runner through real mpirun, with a stand-in trainer (fixtures/fake_kolo_train.py)
that has kolo-train's flags and JSON record: rows appended per point, failures recorded while the
sweep goes on, timeouts that leave no process behind, and resume after the runner is killed."""

import os
import signal
import subprocess
import sys
import time

import pytest
from reports import launch, schema

from conftest import FAKE_TRAIN, ROOT, need_mpirun, run_cli


def sweep_text(models=("resnet101", "vgg16"), ranks=(1, 2), timeout_s=60, extra=""):
    return f"""
[sweep]
name = "runner-test"
timeout_s = {timeout_s}
[launcher]
kind = "mpirun"
program = "{FAKE_TRAIN}"
[fixed]
batch_size = 16
{extra}
[matrix]
model = {list(models)!r}
ranks = {list(ranks)!r}
"""


@pytest.fixture(autouse=True)
def _mpirun():
    need_mpirun()


def test_rows_logs_efficiency_and_report(write_sweep, tmp_path):
    out = tmp_path / "out"
    calls = tmp_path / "calls.txt"
    result = run_cli(
        "sweep", write_sweep(sweep_text()), "--out", str(out), env={"FAKE_TRAIN_CALLS": str(calls)}
    )
    assert result.returncode == 0, result.stderr
    rows = schema.read_rows(str(out / "results.csv"))
    # Each model's single-rank baseline without distribution first, added and said so.
    assert [(r["model"], r["ranks"], r["backend"], r["status"]) for r in rows] == [
        ("resnet101", "1", "none", "ok"),
        ("vgg16", "1", "none", "ok"),
        ("resnet101", "1", "ring", "ok"),
        ("vgg16", "1", "ring", "ok"),
        ("resnet101", "2", "ring", "ok"),
        ("vgg16", "2", "ring", "ok"),
    ]
    assert result.stderr.count("added the single-rank baseline without distribution") == 2
    # The stand-in makes 100 / (1 + 0.1 (ranks - 1)) images/sec per rank: 2 ranks -> 1/1.1.
    assert [r["scaling_efficiency"] for r in rows] == ["1.0000"] * 4 + ["0.9091"] * 2
    assert [r["baseline_images_per_sec"] for r in rows] == ["100"] * 6
    for r in rows:
        log = (out / r["log"]).read_text()
        assert log.startswith("$ mpirun -np") and "total images/sec" in log
        assert r["run_id"] and r["timestamp"] and r["hosts"]
    assert len(calls.read_text().splitlines()) == 6
    assert sum("--backend none" in line for line in calls.read_text().splitlines()) == 2
    assert "ETA" in result.stderr and "6/6 100%" in result.stderr
    assert (out / "report" / "index.html").exists()
    # A second run has nothing to do.
    again = run_cli(
        "sweep", write_sweep(sweep_text()), "--out", str(out), env={"FAKE_TRAIN_CALLS": str(calls)}
    )
    assert again.returncode == 0 and "6 point(s) already in" in again.stderr
    assert len(calls.read_text().splitlines()) == 6


def test_failed_point_is_a_row_and_the_sweep_goes_on(write_sweep, tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "sweep",
        write_sweep(sweep_text(ranks=(1,))),
        "--out",
        str(out),
        "--no-report",
        env={"FAKE_TRAIN_FAIL": "resnet101"},
    )
    assert result.returncode == 1
    rows = schema.read_rows(str(out / "results.csv"))
    # (A failed point has no record to name the default backend, ring.)
    assert [(r["model"], r["backend"], r["status"]) for r in rows] == [
        ("resnet101", "none", "failed"),
        ("vgg16", "none", "ok"),
        ("resnet101", "", "failed"),
        ("vgg16", "ring", "ok"),
    ]
    assert rows[2]["error"].startswith("exit status 3: kolo-train: error: model 'resnet101' cannot run here")
    assert rows[2]["total_images_per_sec"] == ""
    assert "failed: model=resnet101" in result.stderr
    # --retry-failed runs only the failed point again; the newest row wins.
    retry = run_cli(
        "sweep", write_sweep(sweep_text(ranks=(1,))), "--out", str(out), "--retry-failed", "--no-report"
    )
    assert retry.returncode == 0, retry.stderr
    latest = schema.latest_per_point(schema.read_rows(str(out / "results.csv")))
    assert sorted((r["model"], r["backend"], r["status"]) for r in latest) == [
        ("resnet101", "none", "ok"),
        ("resnet101", "ring", "ok"),
        ("vgg16", "none", "ok"),
        ("vgg16", "ring", "ok"),
    ]


def test_timeout_stops_every_process(write_sweep, tmp_path):
    out = tmp_path / "out"
    started = time.monotonic()
    result = run_cli(
        "sweep",
        # 10 s: the points that do not hang must finish in it on a loaded 2-core host too.
        write_sweep(sweep_text(ranks=(2,), timeout_s=10)),
        "--out",
        str(out),
        "--no-report",
        env={"FAKE_TRAIN_HANG": "resnet101"},
    )
    assert time.monotonic() - started < 90
    assert result.returncode == 1
    rows = schema.read_rows(str(out / "results.csv"))
    assert [(r["model"], r["ranks"], r["status"]) for r in rows] == [
        ("resnet101", "1", "failed"),  # the baseline
        ("vgg16", "1", "ok"),
        ("resnet101", "2", "failed"),
        ("vgg16", "2", "ok"),
    ], [r["error"] for r in rows]
    assert rows[2]["error"].startswith("timed out after 10 s")
    # Nothing of the point lives on, not even the grandchild that left the process group.
    survivors = [pid for pid in filter(str.isdigit, os.listdir("/proc")) if _is_sleep_600(pid)]
    assert not survivors, survivors


def _is_sleep_600(pid):
    """A `sleep 600` that a point of a sweep started (it carries the runner's point token)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().split(b"\0")[:2] != [b"sleep", b"600"]:
                return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{launch.TOKEN_VAR}=".encode() in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_resume_after_the_runner_is_killed(write_sweep, tmp_path, sig):
    out = tmp_path / "out"
    calls = tmp_path / "calls.txt"
    path = write_sweep(sweep_text(models=("resnet101", "vgg16", "resnet50"), ranks=(1, 2)))
    # resnet50's points stall (its baseline is the third point), so the sweep cannot finish before
    # the kill however long this process is kept from running; the first two points take 1 s each.
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        FAKE_TRAIN_CALLS=str(calls),
        FAKE_TRAIN_SLEEP_S="1",
        FAKE_TRAIN_STALL="resnet50",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "reports.cli", "sweep", path, "--out", str(out), "--no-report"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    csv_path = str(out / "results.csv")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(schema.read_rows(csv_path)) < 2:
        time.sleep(0.2)
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    done = {r["point_id"] for r in schema.read_rows(csv_path)}
    # 3 models x 2 rank counts and the 3 baselines; the baselines run first, resnet50's stalled.
    assert len(done) == 2
    # The interrupted point's processes are gone (SIGTERM: stopped by the runner; SIGKILL: the
    # launcher dies with its parent and its ranks with it).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _fake_trainers(out):
        time.sleep(0.2)
    assert not _fake_trainers(out)
    started_before = len(calls.read_text().splitlines())

    result = run_cli("sweep", path, "--out", str(out), "--no-report", env={"FAKE_TRAIN_CALLS": str(calls)})
    assert result.returncode == 0, result.stderr
    rows = schema.read_rows(csv_path)
    assert len(rows) == 9 and len({r["point_id"] for r in rows}) == 9
    assert all(r["status"] == "ok" for r in rows)
    # Only the points without a row ran again.
    assert len(calls.read_text().splitlines()) - started_before == 9 - len(done)


def test_a_signal_just_as_a_point_starts_still_stops_its_processes(write_sweep, tmp_path):
    """SIGTERM arriving right after a point's launcher started, before the runner waits on it (the
    moment a resume test's kill can land), stops the point's processes like one that comes later."""
    out = tmp_path / "out"
    path = write_sweep(sweep_text(models=("resnet50",), ranks=(1,)))
    driver = (
        "import os, runpy, signal, sys\n"
        "from reports import launch\n"
        "real_start = launch.start\n"
        "def start(*args, **kwargs):\n"
        "    proc = real_start(*args, **kwargs)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return proc\n"
        "launch.start = start\n"
        "sys.argv = ['reports.cli', *sys.argv[1:]]\n"
        "runpy.run_module('reports.cli', run_name='__main__')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), FAKE_TRAIN_STALL="resnet50")
    proc = subprocess.run(
        [sys.executable, "-c", driver, "sweep", path, "--out", str(out), "--no-report"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "SIGTERM" in proc.stderr, proc.stderr
    assert not schema.read_rows(str(out / "results.csv"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _fake_trainers(out):
        time.sleep(0.2)
    assert not _fake_trainers(out)


def test_a_point_starts_with_no_signal_held(tmp_path):
    # The runner holds SIGINT, SIGTERM and SIGHUP while it starts a point; the launcher it starts
    # must not inherit them held, or it could not be stopped but by SIGKILL.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    try:
        proc = launch.start(["sleep", "30"], dict(os.environ), str(tmp_path / "log"), "tok-held")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            blocked = [line.split()[1] for line in f if line.startswith("SigBlk:")]
        assert blocked == ["0000000000000000"]
        proc.terminate()
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _fake_trainers(out):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if FAKE_TRAIN.name.encode() in cmd and str(out).encode() in cmd:
            found.append(pid)
    return found


def test_second_sweep_on_the_same_folder_is_refused(write_sweep, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    import fcntl

    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = run_cli("sweep", write_sweep(sweep_text()), "--out", str(out))
    assert result.returncode == 1 and "another sweep is writing" in result.stderr


def test_missing_trainer_is_named(write_sweep, tmp_path):
    text = sweep_text().replace(str(FAKE_TRAIN), str(tmp_path / "no-such-trainer"))
    result = run_cli("sweep", write_sweep(text), "--out", str(tmp_path / "out"))
    assert result.returncode == 1 and "not found or not executable" in result.stderr


def test_dry_run_lists_commands(write_sweep, tmp_path):
    result = run_cli("sweep", write_sweep(sweep_text()), "--out", str(tmp_path / "out"), "--dry-run")
    assert result.returncode == 0
    assert result.stdout.count("mpirun -np") == 6 and "--oversubscribe" in result.stdout
    assert result.stdout.count("--backend none") == 2
    assert not (tmp_path / "out").exists()


def test_local_launcher_runs_ranks_with_kolo_run(write_sweep, tmp_path):
    bin_dir = os.environ.get("KOLO_BIN_DIR", str(ROOT / "build" / "bin"))
    if not os.access(os.path.join(bin_dir, "kolo-run"), os.X_OK):
        pytest.skip(f"{bin_dir}/kolo-run is not built (scripts/build, or set KOLO_BIN_DIR)")
    text = sweep_text(models=("vgg16",), ranks=(1, 3)).replace('kind = "mpirun"', 'kind = "local"')
    out = tmp_path / "out"
    result = run_cli("sweep", write_sweep(text), "--out", str(out), "--bin-dir", bin_dir, "--no-report")
    assert result.returncode == 0, result.stderr
    rows = schema.read_rows(str(out / "results.csv"))
    # The stand-in counts its ranks from KOLO_SIZE, which only kolo-run sets.
    assert [(r["ranks"], r["total_images_per_sec"]) for r in rows] == [
        ("1", "100"),  # the baseline
        ("1", "100"),
        ("3", "250"),
    ]  # 3 x 100 / 1.2
    assert (out / rows[2]["log"]).read_text().startswith("$ " + bin_dir + "/kolo-run -np 3")


def test_local_launcher_binds_ranks_as_the_sweep_says(write_sweep, tmp_path):
    bin_dir = os.environ.get("KOLO_BIN_DIR", str(ROOT / "build" / "bin"))
    if not os.access(os.path.join(bin_dir, "kolo-run"), os.X_OK):
        pytest.skip(f"{bin_dir}/kolo-run is not built (scripts/build, or set KOLO_BIN_DIR)")
    text = sweep_text(models=("vgg16",), ranks=(2,)).replace(
        'kind = "mpirun"', 'kind = "local"\nbind_to = "hwthread"'
    )
    out = tmp_path / "out"
    result = run_cli("sweep", write_sweep(text), "--out", str(out), "--bin-dir", bin_dir, "--no-report")
    assert result.returncode == 0, result.stderr
    rows = schema.read_rows(str(out / "results.csv"))
    assert [r["status"] for r in rows] == ["ok", "ok"]
    log = (out / rows[1]["log"]).read_text()
    assert log.startswith(f"$ {bin_dir}/kolo-run -np 2 --timeout-s 61 --bind-to hwthread -- "), log


def test_an_earlier_kolos_results_file_is_carried_over(write_sweep, tmp_path):
    # A folder measured by an earlier kolo (no breakdown or baseline columns): its rows are kept,
    # the file is rewritten in today's columns, and only the points it lacks run.
    from test_schema import write_older

    out = tmp_path / "out"
    first = run_cli(
        "sweep", write_sweep(sweep_text(models=("vgg16",), ranks=(1,))), "--out", str(out), "--no-report"
    )
    assert first.returncode == 0, first.stderr
    csv_path = out / "results.csv"
    before = schema.read_rows(str(csv_path))
    write_older(csv_path, before)
    assert schema.header_of(str(csv_path)) != schema.COLUMNS
    result = run_cli(
        "sweep", write_sweep(sweep_text(models=("vgg16",), ranks=(1, 2))), "--out", str(out), "--no-report"
    )
    assert result.returncode == 0, result.stderr
    assert "rewritten in today's columns" in result.stderr and "2 point(s) already in" in result.stderr
    assert schema.header_of(str(csv_path)) == schema.COLUMNS
    rows = schema.read_rows(str(csv_path))
    assert [r["point_id"] for r in rows[:2]] == [r["point_id"] for r in before]
    assert [(r["ranks"], r["scaling_efficiency"]) for r in rows] == [
        ("1", "1.0000"),
        ("1", "1.0000"),
        ("2", "0.9091"),
    ]


def _sleeper(token):
    env = dict(os.environ, **{launch.TOKEN_VAR: token})
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)


def test_the_guard_stops_a_points_processes_only_when_the_runner_dies():
    # The point is over: the guard is told so and leaves every process alone.
    token = f"guard-test-{os.getpid()}"
    sleeper = _sleeper(token)
    try:
        guard = launch.point_guard(token)
        guard.release()
        assert guard.proc.returncode == 0
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
    # The runner died (its end of the pipe closed without a word): the guard kills the token's
    # processes, and nothing else.
    sleeper, bystander = _sleeper(token), _sleeper(token + "-other")
    try:
        guard = launch.point_guard(token)
        guard.release(done=False, timeout=30)
        assert guard.proc.returncode == 0
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for p in (sleeper, bystander):
            p.kill()
            p.wait()
