"""Sweeps as a GPU cluster runs them: hosts from the command line, parameter servers placed one per
worker host or on hosts of their own, combinations that cannot run refused before the first point,
run records that come back without a shared filesystem, and Slurm's srun as a launcher (through
fixtures/fake_srun.py, which starts a step's tasks on this host with srun's variables, since no
Slurm runs here; the ranks are the real kolo-train)."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from reports import launch, launchers, placement, runner, schema, sweepfile

from conftest import FIXTURES, ROOT, run_cli

BIN_DIR = Path(os.environ.get("KOLO_BIN_DIR", ROOT / "build" / "bin"))
FAKE_SRUN = FIXTURES / "fake_srun.py"
PROFILE = "models/profiles/resnet101-h100-b64.json"


def cluster_sweep(extra_fixed="", matrix="ranks = [8, 16]", launcher='hosts = "n1:8,n2:8,n3:8"'):
    return f"""
[sweep]
name = "cluster-test"
[launcher]
kind = "mpirun"
{launcher}
[fixed]
model = "resnet101"
compute = "cudnn"
batch_size = 64
{extra_fixed}
[matrix]
{matrix}
"""


def problems_of(write_sweep, text, **overrides) -> list[str]:
    with pytest.raises(sweepfile.SweepError) as e:
        sweepfile.load(write_sweep(text), str(ROOT), **overrides)
    return e.value.problems


def test_spread_puts_one_server_beside_the_workers_of_each_host():
    point = {"ranks": 16, "backend": "ps", "ps_servers": 2, "ps_hosts": "spread"}
    where, why = placement.plan(point, [("n1", 8), ("n2", 8), ("n3", 8)])
    assert why is None
    assert where.hosts == [("n1", 9), ("n2", 9)]
    assert where.server_ranks == [8, 17]
    assert where.lines == ["n1: ranks 0-7 workers, rank 8 server", "n2: ranks 9-16 workers, rank 17 server"]
    # More servers than worker hosts go round them again; a partly filled host takes its share.
    point = {"ranks": 12, "backend": "ps", "ps_servers": 3, "ps_hosts": "spread"}
    where, _ = placement.plan(point, [("n1", 8), ("n2", 8)])
    assert where.hosts == [("n1", 10), ("n2", 5)]
    assert where.server_ranks == [8, 9, 14]


def test_dedicated_puts_servers_on_hosts_without_workers():
    point = {"ranks": 12, "backend": "ps", "ps_servers": 2, "ps_hosts": "dedicated"}
    where, why = placement.plan(point, [("n1", 8), ("n2", 8), ("n3", 8), ("n4", 8)])
    assert why is None
    assert where.hosts == [("n1", 8), ("n2", 4), ("n3", 1), ("n4", 1)]
    assert where.server_ranks == [12, 13]
    where, why = placement.plan(point, [("n1", 8), ("n2", 8)])
    assert where is None and "needs hosts beyond the 2" in why
    where, why = placement.plan(point, [("n1", 8), ("n2", None)])
    assert where is None and "slots for every host" in why
    where, why = placement.plan({"ranks": 20, "backend": "ps", "ps_hosts": "spread"}, [("n1", 8), ("n2", 8)])
    assert where is None and "needs 20 worker slots but the hosts give 16" in why


def test_the_command_line_hosts_replace_the_files(write_sweep, tmp_path):
    text = cluster_sweep('backend = "ps"\nps_servers = 2\nps_hosts = "spread"')
    sweep = sweepfile.load(write_sweep(text), str(ROOT), hosts="gpu1:4,gpu2:4,gpu3:4,gpu4:4")
    assert sweep.launcher.hosts == [("gpu1", 4), ("gpu2", 4), ("gpu3", 4), ("gpu4", 4)]
    point = next(p for p in sweep.points if p["ranks"] == 8)
    argv = launch.command(point, sweep.launcher, "kolo-train", "kolo-run", "/r.json", 60, None)
    assert argv[argv.index("-H") + 1] == "gpu1:5,gpu2:5"
    assert argv[argv.index("--ps-server-ranks") + 1] == "4,9"
    assert "--json-stdout" in argv and argv[argv.index("--map-by") + 1] == "slot"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu7 slots=8\n# a comment\ngpu8 slots=8\n")
    sweep = sweepfile.load(write_sweep(text), str(ROOT), hostfile=str(hostfile))
    assert sweep.launcher.hostfile == str(hostfile) and not sweep.launcher.hosts
    point = next(p for p in sweep.points if p["ranks"] == 16)
    argv = launch.command(point, sweep.launcher, "kolo-train", "kolo-run", "/r.json", 60, None)
    assert argv[argv.index("-H") + 1] == "gpu7:9,gpu8:9"
    local = '[sweep]\nname = "x"\n[launcher]\nkind = "local"\n[fixed]\nmodel = "resnet101"\nranks = 2\n'
    assert (
        'replaces the hosts of [launcher] kind = "mpirun"' in problems_of(write_sweep, local, hosts="a:1")[0]
    )
    assert "both given" in problems_of(write_sweep, local, hosts="a:1", hostfile="f")[0]


def test_the_dry_run_prints_each_points_placement(write_sweep, tmp_path):
    text = cluster_sweep('backend = "ps"\nps_servers = 1\nps_hosts = "dedicated"', matrix="ranks = [16]")
    result = run_cli(
        "sweep", write_sweep(text), "--out", str(tmp_path / "o"), "--dry-run", "--hosts", "a:8,b:8,c:8"
    )
    assert result.returncode == 0, result.stderr
    assert "placement a: ranks 0-7 workers" in result.stdout
    assert "placement c: rank 16 server" in result.stdout
    assert "-H a:8,b:8,c:1" in result.stdout
    assert not (tmp_path / "o").exists()


def test_combinations_that_cannot_run_are_refused_before_the_first_point(write_sweep):
    problems = problems_of(
        write_sweep,
        cluster_sweep(
            matrix='ranks = [2]\nbackend = ["nccl", "ring"]\ncompute = ["onednn", "cudnn"]\n'
            'precision = ["fp16"]'
        ).replace('compute = "cudnn"\n', "", 1),
    )
    text = "\n".join(problems)
    assert 'precision = "fp16" with compute = "onednn": oneDNN computes in fp32 only' in text
    assert 'backend = "nccl" reduces GPU tensors; it needs compute = "cudnn"' in text
    assert "compute=cudnn backend=ring" not in text  # the runnable ones are not named
    problems = problems_of(
        write_sweep, cluster_sweep('backend = "ps"\nps_hosts = "spread"', launcher='hosts = "localhost:4"')
    )
    assert any("ps_hosts = 'spread' places parameter servers on hosts" in p for p in problems)
    problems = problems_of(
        write_sweep, cluster_sweep('backend = "ps"\nps_hosts = "dedicated"', matrix="ranks = [24]")
    )
    assert any("needs hosts beyond the 3" in p for p in problems)


SRUN_SWEEP = """
[sweep]
name = "srun-test"
timeout_s = 240
[launcher]
kind = "srun"
srun = "{srun}"
partition = "gpu"
tasks_per_node = 4
gpus_per_node = 4
time_limit = "10:00"
env = {{ KOLO_PEER_TIMEOUT_SECONDS = "60" }}
[fixed]
model = "resnet101"
compute = "replay"
profile = "{profile}"
batch_size = 64
num_warmup_batches = 1
num_batches = 3
[matrix]
ranks = [2]
backend = ["ring", "ps"]
"""


def test_srun_launcher_keys_are_checked(write_sweep):
    text = SRUN_SWEEP.format(srun="srun", profile=PROFILE)
    bad = text.replace("tasks_per_node = 4\n", "").replace('time_limit = "10:00"', 'time_limit = "soon"')
    problems = "\n".join(problems_of(write_sweep, bad + '\n[[exclude]]\nbackend = "none"\n'))
    assert "needs tasks_per_node" in problems
    assert "time_limit = 'soon' is not allowed" in problems
    mpi = text.replace('backend = ["ring", "ps"]', 'backend = ["mpi"]')
    assert any('backend "mpi" needs mpirun' in p for p in problems_of(write_sweep, mpi))
    hosts = text.replace('partition = "gpu"', 'partition = "gpu"\nhosts = "a:2"')
    assert any('hosts is not allowed with kind = "srun"' in p for p in problems_of(write_sweep, hosts))
    sweep = sweepfile.load(write_sweep(text), str(ROOT))
    point = next(p for p in sweep.points if p.get("backend") == "ps")
    argv = launch.command(point, sweep.launcher, "kolo-train", "kolo-run", "/r.json", 60, None)
    assert argv[:8] == ["srun", "--ntasks", "3", "--nodes", "1", "--ntasks-per-node", "3", "--distribution"]
    for flag, value in (("--partition", "gpu"), ("--gpus-per-node", "4"), ("--time", "10:00")):
        assert argv[argv.index(flag) + 1] == value
    assert "--json-stdout" in argv


def test_a_sweep_through_srun_trains_with_real_ranks(write_sweep, tmp_path):
    if not (BIN_DIR / "kolo-train").exists():
        pytest.skip(f"{BIN_DIR / 'kolo-train'} is not built")
    out = tmp_path / "out"
    calls = tmp_path / "srun-args.txt"
    text = SRUN_SWEEP.format(srun=FAKE_SRUN, profile=PROFILE)
    result = run_cli(
        "sweep",
        write_sweep(text),
        "--out",
        str(out),
        "--bin-dir",
        str(BIN_DIR),
        "--no-report",
        env={"FAKE_SRUN_ARGS": str(calls)},
    )
    assert result.returncode == 0, result.stderr + "".join(
        p.read_text() for p in out.glob("points/*/log.txt")
    )
    rows = schema.read_rows(str(out / "results.csv"))
    got = sorted((r["backend"], r["ranks"], r["status"], r["network"]) for r in rows)
    assert got == [
        ("none", "1", "ok", "physical"),
        ("ps", "2", "ok", "physical"),
        ("ring", "2", "ok", "physical"),
    ]
    assert all(float(r["total_images_per_sec"]) > 0 for r in rows)
    assert "--partition gpu" in calls.read_text()


def test_records_come_back_with_the_output(tmp_path):
    log = tmp_path / "log.txt"
    record = {"status": "ok", "settings": {"ranks": 2}, "results": {"total_images_per_sec": 5.0}}
    log.write_text("rank 1 says hi\n" + runner.RECORD_PREFIX + json.dumps(record) + "\nbye\n")
    assert runner._record_from_log(str(log)) == (record, "")
    log.write_text(runner.RECORD_PREFIX + '{"status": "ok", "settings"\n')
    got, why = runner._record_from_log(str(log))
    assert got is None and "unreadable record" in why
    log.write_text("nothing\n")
    assert runner._record_from_log(str(log)) == (None, "")
    # kolo-train itself prints one line that is the whole record.
    train = BIN_DIR / "kolo-train"
    if not train.exists():
        pytest.skip(f"{train} is not built")
    done = subprocess.run(
        [
            str(train),
            "--model",
            "resnet101",
            "--compute",
            "replay",
            "--profile",
            str(ROOT / PROFILE),
            "--batch-size",
            "64",
            "--num-warmup-batches",
            "1",
            "--num-batches",
            "2",
            "--json-stdout",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(runner.RECORD_PREFIX)]
    assert len(lines) == 1
    printed = json.loads(lines[0][len(runner.RECORD_PREFIX) :])
    assert printed["status"] == "ok" and printed["results"]["total_images_per_sec"] > 0


RDMA_SWEEP = """
[sweep]
name = "rdma-check"
timeout_s = 60
[launcher]
kind = "local"
[fixed]
model = "resnet101"
compute = "replay"
profile = "models/profiles/resnet101-h100-b64.json"
batch_size = 64
num_warmup_batches = 1
num_batches = 2
[matrix]
ranks = [2]
transport = ["tcp", "rdma"]
"""


def test_a_host_without_rdma_stops_the_sweep_before_its_first_point(write_sweep, tmp_path):
    if not (BIN_DIR / "kolo-train").exists():
        pytest.skip(f"{BIN_DIR / 'kolo-train'} is not built")
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.skip("this host has an RDMA device")
    out = tmp_path / "out"
    result = run_cli("sweep", write_sweep(RDMA_SWEEP), "--out", str(out), "--bin-dir", str(BIN_DIR))
    assert result.returncode == 2, result.stderr
    assert "transport rdma cannot run on every host of this sweep" in result.stderr
    assert "none of its 1 rdma point(s) is started" in result.stderr
    assert "cannot use transport rdma" in result.stderr
    assert not (out / "results.csv").exists()  # not one row, the tcp point included


def test_the_transport_check_runs_once_on_every_host():
    sweep_hosts = launchers.make(
        kind="mpirun", hosts=[("n1", 8), ("n2", 8)], env={"KOLO_IB_DEVICE": "mlx5_0"}
    )
    argv = launch.check_command(sweep_hosts, "/opt/kolo-train", "rdma", 16)
    assert argv[:5] == ["mpirun", "-np", "2", "-H", "n1:1,n2:1"]
    assert argv[argv.index("-x") + 1] == "KOLO_IB_DEVICE=mlx5_0"
    assert argv[-4:] == ["/opt/kolo-train", "--check-transport", "--transport", "rdma"]
    srun = launchers.make(kind="srun", tasks_per_node=8)
    argv = launch.check_command(srun, "/opt/kolo-train", "rdma", 20)
    assert argv[:7] == ["srun", "--nodes", "3", "--ntasks", "3", "--ntasks-per-node", "1"]
    local = launchers.make(kind="local")
    assert launch.check_command(local, "k", "rdma", 4) == ["k", "--check-transport", "--transport", "rdma"]
