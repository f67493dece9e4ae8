"""Sweeps on an emulated network ([launcher] kind = "cluster", scripts/cluster): the points'
network settings, the clusters they run on, their command lines, the fallback to loopback where
no cluster can be made, and, where scripts/cluster check passes here, sweeps of the stand-in
trainer on real emulated hosts: rows that say so, a failed point that does not stop the sweep, and
a runner stopped or killed mid-point that leaves no namespace or process behind."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from reports import cli, cluster, launch, launchers, schema, sweepfile

from conftest import FAKE_TRAIN, ROOT, need_mpirun, run_cli

NETWORK = """
[sweep]
name = "cluster-test"
timeout_s = {timeout_s}
[launcher]
kind = "cluster"
{launcher}
[fixed]
compute = "replay"
profile = "models/profiles/{{model}}-h100-b64.json"
batch_size = 64
link = "1gbit"
dilation = 25
{fixed}
[matrix]
model = {models!r}
ranks = {ranks!r}
backend = {backends!r}
"""


def network_text(
    models=("vgg16",), ranks=(1, 2, 4), backends=("ring", "ps"), launcher="", fixed="", timeout_s=120
):
    return NETWORK.format(
        models=list(models),
        ranks=list(ranks),
        backends=list(backends),
        launcher=launcher,
        fixed=fixed,
        timeout_s=timeout_s,
    )


def load(write_sweep, text):
    return sweepfile.load(write_sweep(text), str(ROOT))


def test_points_spell_out_their_network(write_sweep):
    sweep = load(write_sweep, network_text())
    shapes = [
        (p["ranks"], p["backend"], p["hosts"], p["ranks_per_host"], p["link"], p["delay_us"], p["dilation"])
        for p in sweep.points
    ]
    assert shapes == [
        (1, "none", 1, 1, "1gbit", 0, 25),  # the baseline: one host, the same dilation
        (1, "ring", 1, 1, "1gbit", 0, 25),
        (1, "ps", 1, 1, "1gbit", 0, 25),
        (2, "ring", 2, 1, "1gbit", 0, 25),
        (2, "ps", 2, 1, "1gbit", 0, 25),
        (4, "ring", 4, 1, "1gbit", 0, 25),
        (4, "ps", 4, 1, "1gbit", 0, 25),
    ]
    # A parameter server runs on a host of its own, after the workers'.
    assert [cluster.cluster_hosts(p) for p in sweep.points] == [1, 1, 2, 2, 3, 4, 5]
    # One cluster, as large as the largest point, serves every point.
    assert set(cluster.plan(sweep.points)) == {cluster.Shape(5, 1, "1gbit", 0)}


def test_ranks_per_host_and_link_axes_get_a_cluster_each(write_sweep):
    text = network_text(ranks=(2, 4), backends=("ring",)).replace(
        'link = "1gbit"', "ranks_per_host = 2\ndelay_us = 0"
    )
    text = text.replace("[matrix]", '[matrix]\nlink = ["1gbit", "500mbit"]')
    sweep = load(write_sweep, text)
    ring = [p for p in sweep.points if p["backend"] == "ring"]
    assert [(p["ranks"], p["hosts"], p["link"]) for p in ring] == [
        (2, 1, "1gbit"),
        (2, 1, "500mbit"),
        (4, 2, "1gbit"),
        (4, 2, "500mbit"),
    ]
    shapes = cluster.plan(ring)
    assert shapes == [cluster.Shape(2, 2, "1gbit"), cluster.Shape(2, 2, "500mbit")] * 2
    assert shapes[0].up_argv("swab12") == [
        cluster.SCRIPT,
        "up",
        "--name",
        "swab12",
        "--hosts",
        "2",
        "--ranks-per-host",
        "2",
        "--link",
        "1gbit",
    ]
    assert cluster.Shape(3, 1, "1gbit", 200).up_argv("x")[-2:] == ["--delay-us", "200"]
    # The emulated per-flow cap: a cluster of its own, passed to scripts/cluster up.
    capped = cluster.needed(dict(ring[0], flow_cap="250mbit"))
    assert capped.up_argv("x")[-2:] == ["--flow-cap", "250mbit"]
    assert "capped at 250mbit" in capped.describe()
    assert not capped.fits(cluster.needed(ring[0]))
    assert cluster.needed(dict(ring[0], flow_cap="off")) == cluster.needed(ring[0])
    assert cluster.Shape(5, 1, "1gbit").fits(cluster.Shape(2, 1, "1gbit"))
    assert not cluster.Shape(2, 1, "1gbit").fits(cluster.Shape(5, 1, "1gbit"))
    assert not cluster.Shape(5, 1, "1gbit").fits(cluster.Shape(2, 1, "500mbit"))


def test_hosts_given_must_match_and_ranks_label_the_points(write_sweep):
    sweep = load(write_sweep, network_text(ranks=(2,), backends=("ring",), fixed="hosts = 2"))
    assert [(p["ranks"], p["hosts"]) for p in sweep.points] == [(1, 1), (2, 2)]
    assert sweepfile.only(sweep, ["ranks=2"]).points[-1]["hosts"] == 2


def test_the_command_runs_mpirun_on_the_cluster_with_the_trainers_dilation(write_sweep):
    sweep = load(
        write_sweep, network_text(ranks=(2,), launcher='env = { KOLO_PEER_TIMEOUT_SECONDS = "120" }')
    )
    ps = next(p for p in sweep.points if p["backend"] == "ps")
    argv = launch.command(
        ps, sweep.launcher, "/b/kolo-train", "/b/kolo-run", "/o/r.json", 60, "/p.json", "swab12", "/s/cluster"
    )
    assert argv[:12] == [
        "/s/cluster",
        "mpirun",
        "--name",
        "swab12",
        "--ranks-per-host",
        "1",
        "--",
        "-np",
        "3",  # 2 workers and the server
        "--bind-to",
        "none",
        "-x",
    ]
    assert argv[12] == launch.TOKEN_VAR and "-x KOLO_PEER_TIMEOUT_SECONDS=120" in " ".join(argv)
    train = argv[argv.index("/b/kolo-train") :]
    assert "--dilation" in train and train[train.index("--dilation") + 1] == "25"
    assert "--backend" in train and "--json" in train
    # The network is the launcher's business, not kolo-train's; and no loopback flags.
    for word in ("--hosts", "--link", "--ranks-per-host", "--delay-us"):
        assert word not in train
    assert "lo" not in argv and "--oversubscribe" not in argv
    with pytest.raises(ValueError, match="cluster"):
        launch.command(ps, sweep.launcher, "kt", "kr", "r.json", 60, None)


def test_dry_run_lists_up_each_point_and_down(write_sweep, tmp_path):
    if not cluster.check().ok:
        pytest.skip(f"scripts/cluster check fails here: {cluster.check().text}")
    result = run_cli("sweep", write_sweep(network_text()), "--out", str(tmp_path / "o"), "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count(" up --name ") == 1 and "--hosts 5 --ranks-per-host 1 --link 1gbit" in out
    assert out.count(" mpirun --name ") == 7 and out.count("--dilation 25") == 7
    assert out.rstrip().splitlines()[-1].endswith(" down --name " + re.search(r"up --name (\w+)", out)[1])
    assert not (tmp_path / "o").exists()


def test_on_loopback_drops_the_network_and_the_dilation(write_sweep):
    sweep = load(write_sweep, network_text(ranks=(1, 2)))
    plain_text = (
        network_text(ranks=(1, 2))
        .replace('kind = "cluster"', 'kind = "mpirun"')
        .replace('link = "1gbit"\n', "")
        .replace("dilation = 25\n", "")
    )
    plain = load(write_sweep, plain_text)
    fallback = launchers.cluster.on_loopback(sweep)
    assert fallback.launcher.kind == "mpirun" and fallback.launcher.is_local()
    assert [p["point_id"] for p in fallback.points] == [p["point_id"] for p in plain.points]
    for p in fallback.points:
        assert not {"hosts", "ranks_per_host", "link", "delay_us", "dilation"} & set(p)


def test_where_no_cluster_can_be_made_the_fallback_runs_over_loopback(write_sweep):
    no = cluster.Check(False, "cluster check: no: cannot make a network namespace", False)
    sweep = load(write_sweep, network_text(launcher='fallback = "mpirun"'))
    here, note, problems = cli._network_here(sweep, no)
    assert problems == [] and here.launcher.kind == "mpirun"
    assert "no emulated network here (cluster check: no: cannot make a network namespace)" in note
    assert "not a network" in note
    # Without a fallback the sweep is refused, saying why and what would allow it.
    sweep = load(write_sweep, network_text())
    here, note, problems = cli._network_here(sweep, no)
    assert note is None and len(problems) == 1
    assert "cannot make a network namespace" in problems[0] and 'fallback = "mpirun"' in problems[0]
    # A delay where the kernel cannot emulate one names the key and the value.
    ok = cluster.Check(True, "cluster check: ok (netem: no)", False)
    sweep = load(write_sweep, network_text(fixed="delay_us = 500"))
    _, _, problems = cli._network_here(sweep, ok)
    assert problems and problems[0].startswith("delay_us = 500: this kernel cannot emulate a delay")
    assert cli._network_here(sweep, cluster.Check(True, "ok (netem: yes)", True))[2] == []


def _in_user_namespace(args, env):
    """Runs the CLI in a user namespace of its own, where root cannot make network namespaces:
    scripts/cluster check fails there for real. Skips where no user namespace can be made."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespace can be made here: {probe.stderr.strip()}")
    full = dict(os.environ, PYTHONPATH=str(ROOT), KOLO_SKIP_BUILD="1", **env)
    return subprocess.run(
        ["unshare", "--user", "--map-root-user", sys.executable, "-m", "reports.cli", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_a_machine_without_namespaces_refuses_or_falls_back(write_sweep, tmp_path):
    out = tmp_path / "o"
    refused = _in_user_namespace(["sweep", write_sweep(network_text()), "--out", str(out)], {})
    if "cannot host an emulated network" not in refused.stderr and refused.returncode != 2:
        pytest.skip(f"scripts/cluster check passes even in a user namespace here: {refused.stderr[-500:]}")
    assert refused.returncode == 2, refused.stderr
    assert 'kind = "cluster": this machine cannot host an emulated network' in refused.stderr
    assert not out.exists()
    text = network_text(launcher='fallback = "mpirun"')
    dry = _in_user_namespace(["sweep", write_sweep(text, "f.toml"), "--out", str(out), "--dry-run"], {})
    assert dry.returncode == 0, dry.stderr
    assert "running over loopback instead" in dry.stderr
    assert " up --name " not in dry.stdout and "--dilation" not in dry.stdout
    assert dry.stdout.count("mpirun -np") == 7 and "--mca btl_tcp_if_include lo" in dry.stdout


# --- On real emulated hosts, with the stand-in trainer.


@pytest.fixture
def emulated():
    need_mpirun()
    found = cluster.check()
    if not found.ok:
        pytest.skip(f"scripts/cluster check fails here: {found.text}")


def fake_text(models=("resnet101", "vgg16"), ranks=(2,), timeout_s=60):
    return f"""
[sweep]
name = "cluster-fake"
timeout_s = {timeout_s}
[launcher]
kind = "cluster"
program = "{FAKE_TRAIN}"
[fixed]
batch_size = 16
link = "1gbit"
[matrix]
model = {list(models)!r}
ranks = {list(ranks)!r}
"""


def cluster_names(out) -> list[str]:
    log = out / "cluster.log"
    return sorted(set(re.findall(r" up --name (\w+)", log.read_text()))) if log.exists() else []


def namespaces(name: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [w.split()[0] for w in listed.splitlines() if w.split() and w.split()[0].startswith(name + "-")]


def test_rows_say_emulated_and_a_failed_point_does_not_stop_the_sweep(emulated, write_sweep, tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "sweep",
        write_sweep(fake_text()),
        "--out",
        str(out),
        "--no-report",
        env={"FAKE_TRAIN_FAIL": "resnet101"},
    )
    assert result.returncode == 1, result.stderr
    rows = schema.read_rows(str(out / "results.csv"))
    assert [(r["model"], r["ranks"], r["backend"], r["status"]) for r in rows] == [
        ("resnet101", "1", "none", "failed"),
        ("vgg16", "1", "none", "ok"),
        ("resnet101", "2", "", "failed"),
        ("vgg16", "2", "ring", "ok"),
    ]
    for r in rows:
        assert (r["network"], r["link"], r["link_represented"], r["dilation"]) == (
            "emulated",
            "1gbit",
            "1gbit",
            "1",
        )
        assert r["ranks_per_host"] == "1" and r["delay_us"] == "0"
    good = rows[-1]
    assert good["hosts"] == "h0"  # the stand-in names rank 0's host, which is the cluster's first
    log = (out / good["log"]).read_text()
    assert " up --name " in log and " mpirun --name " in log and "total images/sec" in log
    assert "fake failure" in rows[0]["error"]
    # Each failure brought the cluster down; the next point brought it up again; the end, down.
    text = (out / "cluster.log").read_text()
    assert text.count(" up --name ") == 3 and text.count(" down --name ") == 3
    (name,) = cluster_names(out)
    assert namespaces(name) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_runner_stopped_mid_point_leaves_no_cluster(emulated, write_sweep, tmp_path, sig):
    out = tmp_path / "out"
    path = write_sweep(fake_text(models=("vgg16",), ranks=(2,)))
    env = dict(os.environ, PYTHONPATH=str(ROOT), KOLO_SKIP_BUILD="1", FAKE_TRAIN_SLEEP_S="60")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reports.cli", "sweep", path, "--out", str(out), "--no-report"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Wait until the first point's stand-in sleeps inside the cluster.
        deadline = time.monotonic() + 60
        name = None
        while time.monotonic() < deadline:
            names = cluster_names(out)
            if names and _fake_trainers(out):
                name = names[0]
                break
            time.sleep(0.2)
        assert name is not None, "the first point never started on a cluster"
        assert namespaces(name)
        os.kill(proc.pid, sig)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (-sig if sig == signal.SIGKILL else 128 + sig)
    # SIGTERM: the runner brings it down; SIGKILL: its guard does.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (namespaces(name) or _fake_trainers(out)):
        time.sleep(0.2)
    assert namespaces(name) == [] and _fake_trainers(out) == []


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


# --- The report says where the rows ran.


def test_the_report_names_the_emulated_network_and_the_dilation(tmp_path):
    from test_report import legacy_rows

    rows = [
        dict(
            r, network="emulated", link="1gbit", link_represented="25gbit", dilation="25", ranks_per_host="1"
        )
        for r in legacy_rows()
    ]
    schema.write_rows(str(tmp_path / "results.csv"), rows)
    result = run_cli("report", str(tmp_path))
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "report" / "index.html").read_text()
    assert (
        "network: emulated (scripts/cluster): 1gbit links, 1 rank(s) per host, dilation 25: stands for 25gbit"
        in page
    )
    assert "Time dilation 25: every replayed layer time was slept that many times over" in page
    assert "Not on an emulated network" not in page


def test_the_report_says_when_a_cluster_sweep_ran_over_loopback(tmp_path):
    from test_report import legacy_rows

    schema.write_rows(str(tmp_path / "results.csv"), legacy_rows())
    (tmp_path / "network.txt").write_text(
        "no emulated network here (cluster check: no: test); running over loopback\n"
    )
    result = run_cli("report", str(tmp_path))
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "report" / "index.html").read_text()
    plots_at = page.index("<h2>Plots</h2>")
    banner = page.index("Not on an emulated network: no emulated network here (cluster check: no: test)")
    assert plots_at < banner < page.index("<figure>")
    ring_vs_ps = page[page.index("plots/ring-vs-ps.png") :]
    assert "Over loopback on one host, not a network" in ring_vs_ps[: ring_vs_ps.index("</figure>")]
    assert "network: loopback on one host" in page
