"""Matrix expansion, point ids and the command lines a point runs with."""

import pytest
from reports import launch, launchers, settings, sweepfile

from conftest import ROOT


def load(write_sweep, text):
    """The sweep with only the points of its matrix (the single-rank baselines the loader adds are
    tested on their own below)."""
    sweep = sweepfile.load(write_sweep(text), str(ROOT))
    sweep.points = [p for p in sweep.points if not sweepfile.is_baseline(p)]
    return sweep


def test_a_baseline_is_added_per_model_batch_compute_and_precision(write_sweep):
    text = (
        "[fixed]\nnum_batches=7\nfusion_threshold_mb=0\n[matrix]\nmodel=['vgg16','resnet101']\n"
        "batch_size=[16,32]\nbackend=['ring','ps']\nranks=[1,2]\n"
    )
    sweep = sweepfile.load(write_sweep(text), str(ROOT))
    baselines = [p for p in sweep.points if sweepfile.is_baseline(p)]
    # One per model and batch size, not per backend or rank count, and first, so they run first.
    assert sorted((p["model"], p["batch_size"]) for p in baselines) == [
        ("resnet101", 16),
        ("resnet101", 32),
        ("vgg16", 16),
        ("vgg16", 32),
    ]
    assert sweep.points[:4] == baselines
    # What fixes one rank's compute comes along; the engine's knobs do not.
    assert all(p["num_batches"] == 7 and "fusion_threshold_mb" not in p for p in baselines)
    assert len(sweep.added) == 4 and all("baseline" in note for note in sweep.added)
    assert sweep.label(baselines[0]).count("backend=none") == 1  # backend is an axis here
    assert "(single-rank baseline, no distribution)" in sweep.label(baselines[0])


def test_a_baseline_in_the_file_is_not_added_twice(write_sweep):
    text = (
        "[matrix]\nmodel=['vgg16']\nbackend=['ring','none']\nranks=[1,2]\n"
        "[[exclude]]\nbackend='none'\nranks=2\n"
    )
    sweep = sweepfile.load(write_sweep(text), str(ROOT))
    assert [p["ranks"] for p in sweep.points if p.get("backend") == "none"] == [1]
    assert sweep.added == []


def test_backend_none_runs_one_rank_only(write_sweep):
    with pytest.raises(sweepfile.SweepError, match=r'backend "none".*ranks = 2 is not allowed, only 1'):
        sweepfile.load(write_sweep("[matrix]\nmodel=['vgg16']\nbackend=['none']\nranks=[2]\n"), str(ROOT))


def test_product_with_ranks_outermost_ascending(write_sweep):
    sweep = load(
        write_sweep, "[matrix]\nmodel=['vgg16','resnet101']\nbackend=['ring','mpi']\nranks=[4,1,2]\n"
    )
    assert len(sweep.points) == 12
    assert [p["ranks"] for p in sweep.points] == [1] * 4 + [2] * 4 + [4] * 4
    assert [(p["model"], p["backend"]) for p in sweep.points[:4]] == [
        ("vgg16", "ring"),
        ("vgg16", "mpi"),
        ("resnet101", "ring"),
        ("resnet101", "mpi"),
    ]


def test_fixed_settings_reach_every_point(write_sweep):
    sweep = load(write_sweep, "[fixed]\nbatch_size=32\n[matrix]\nmodel=['vgg16']\nranks=[1,2]\n")
    assert all(p["batch_size"] == 32 for p in sweep.points)


def test_settings_that_do_not_apply_are_dropped_and_merged(write_sweep):
    text = (
        "[matrix]\nmodel=['vgg16']\nranks=[2]\nbackend=['ring','ps','mpi']\n"
        "ps_servers=[1,2]\ntransport=['tcp','rdma']\n"
    )
    sweep = load(write_sweep, text)
    # ring: 2 transports; ps: 2 transports x 2 server counts; mpi: no transport, no servers.
    assert len(sweep.points) == 2 + 4 + 1
    ring = [p for p in sweep.points if p["backend"] == "ring"]
    assert all("ps_servers" not in p for p in ring)
    mpi = [p for p in sweep.points if p["backend"] == "mpi"]
    assert mpi[0].keys() == {"model", "ranks", "backend", "repeat", "point_id"}


def test_exclude_drops_matching_points(write_sweep):
    text = (
        "[matrix]\nmodel=['vgg16','resnet101']\nranks=[1,2]\ntransport=['tcp','rdma']\n"
        "[[exclude]]\nmodel='vgg16'\ntransport=['rdma']\n"
    )
    sweep = load(write_sweep, text)
    assert len(sweep.points) == 6
    assert not [p for p in sweep.points if p["model"] == "vgg16" and p["transport"] == "rdma"]


def test_repeats_and_stable_distinct_ids(write_sweep):
    text = "[sweep]\nrepeats=3\n[matrix]\nmodel=['vgg16']\nranks=[1,2]\n"
    first = load(write_sweep, text)
    second = load(write_sweep, text.replace("ranks=[1,2]", "ranks=[2,1]"))
    assert len(first.points) == 6
    assert [p["repeat"] for p in first.points] == [0, 1, 2, 0, 1, 2]
    ids = [p["point_id"] for p in first.points]
    assert len(set(ids)) == 6
    assert ids == [p["point_id"] for p in second.points]
    # The id follows the settings: another batch size is another point.
    third = load(write_sweep, text + "[fixed]\nbatch_size=8\n")
    assert not set(ids) & {p["point_id"] for p in third.points}


def test_profile_template_is_filled(write_sweep, tmp_path):
    (tmp_path / "vgg16-b16.json").write_text("{}")
    text = f"[fixed]\ncompute='replay'\nbatch_size=16\nprofile='{tmp_path}/{{model}}-b{{batch_size}}.json'\n"
    text += "[matrix]\nmodel=['vgg16']\nranks=[1]\n"
    sweep = load(write_sweep, text)
    assert sweep.points[0]["profile"] == f"{tmp_path}/vgg16-b16.json"


def test_trainer_args_use_kolo_train_flags():
    point = {
        "model": "vgg16",
        "ranks": 4,
        "batch_size": 64,
        "backend": "ps",
        "ps_servers": 2,
        "fusion_threshold_mb": 0.5,
        "cycle_time_ms": 2.0,
        "transport": "tcp",
    }
    assert settings.trainer_args(point) == [
        "--model",
        "vgg16",
        "--batch-size",
        "64",
        "--backend",
        "ps",
        "--transport",
        "tcp",
        "--fusion-threshold-mb",
        "0.5",
        "--cycle-time-ms",
        "2",
        "--ps-servers",
        "2",
    ]
    assert settings.process_count(point) == 6
    assert settings.process_count(dict(point, backend="ring")) == 4


def test_local_mpirun_command_has_the_loopback_flags():
    point = {"model": "vgg16", "ranks": 2, "backend": "ring", "point_id": "x", "repeat": 0}
    argv = launch.command(point, launchers.make(env={"A": "1"}), "/bin/kt", "/bin/kr", "/o/r.json", 60, None)
    assert argv[:3] == ["mpirun", "-np", "2"]
    joined = " ".join(argv)
    for flag in (
        "--oversubscribe",
        "--allow-run-as-root",
        "--mca btl self,tcp",
        "--mca btl_tcp_if_include lo",
        "--mca oob_tcp_if_include lo",
    ):
        assert flag in joined
    assert "-x A=1" in joined
    assert argv[-7:] == ["/bin/kt", "--model", "vgg16", "--backend", "ring", "--json", "/o/r.json"]


def test_cluster_mpirun_command_names_hosts_and_no_loopback():
    launcher = launchers.make(hosts=[("node1", 8), ("node2", 8)], args=["--map-by", "slot"])
    point = {"model": "vgg16", "ranks": 16, "point_id": "x", "repeat": 0}
    argv = launch.command(point, launcher, "kolo-train", "kolo-run", "r.json", 60, None)
    assert argv[:5] == ["mpirun", "-np", "16", "-H", "node1:8,node2:8"]
    assert "lo" not in argv and "--map-by" in argv
    assert launcher.nodes_for(16) == 2 and launcher.nodes_for(9) == 2 and launcher.nodes_for(8) == 1


def test_local_launcher_uses_kolo_run():
    point = {"model": "vgg16", "ranks": 3, "point_id": "x", "repeat": 0}
    argv = launch.command(point, launchers.make(kind="local"), "kt", "/b/kolo-run", "r.json", 60, None)
    assert argv[:6] == ["/b/kolo-run", "-np", "3", "--timeout-s", "61", "--"]
    assert argv[6] == "kt"


def test_shipped_sweep_files_are_valid():
    for path in sorted((ROOT / "sweeps").glob("*.toml")):
        sweep = sweepfile.load(str(path), str(ROOT))
        assert sweep.points, path
