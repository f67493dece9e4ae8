"""The report says what ran where: the host's CPU and cores (its GPU only where the ranks computed
on one), and apart from it the device a replayed profile was recorded on."""

import os
import re

from reports import efficiency, report, schema

from conftest import FAKE_TRAIN, need_mpirun, run_cli

H100 = "NVIDIA H100 80GB HBM3"


def row(**cells) -> dict:
    base = {c: "" for c in schema.COLUMNS}
    base.update(
        run_id="r1",
        point_id="p",
        repeat="0",
        model="vgg16",
        batch_size="64",
        ranks="1",
        nodes="1",
        network="loopback",
        backend="none",
        status="ok",
        total_images_per_sec="10",
        images_per_sec_per_rank="10",
        dilation="1",
    )
    base.update(cells)
    return base


def header(rows: list[dict]) -> str:
    rows = efficiency.with_efficiency(rows)
    page = report.render(rows, efficiency.aggregate(rows), [], "t", None, None)
    found = re.search(r"<ul><li>network: .*?</ul>", page)
    assert found, "the report has no list of what ran where"
    return found.group(0)


def test_replay_on_a_cpu_only_host_names_the_host_and_where_the_profile_was_recorded():
    text = header([row(compute="replay", cpu_model="AMD EPYC", cpu_cores="2", gpu_model=H100)])
    assert "<li>host hardware: CPU AMD EPYC (2 cores)</li>" in text
    assert f"<li>replayed profile recorded on: {H100}</li>" in text
    assert "GPU" not in text.replace(f"recorded on: {H100}", "")


def test_a_run_that_computed_on_a_gpu_names_it_with_the_host():
    text = header([row(compute="cudnn", cpu_model="Intel Xeon", cpu_cores="16", gpu_model=H100)])
    assert f"<li>host hardware: CPU Intel Xeon (16 cores), GPU {H100}</li>" in text
    assert "replayed profile" not in text


def test_a_row_without_cores_or_hardware_says_only_what_it_has():
    text = header([row(compute="onednn", cpu_model="AMD EPYC"), row(point_id="q", network="simulated")])
    assert "<li>host hardware: CPU AMD EPYC</li>" in text
    assert "cores" not in text


def test_make_row_keeps_the_cores_and_an_older_file_reads_without_them(tmp_path):
    point = {"point_id": "p", "repeat": 0, "model": "vgg16", "ranks": 1}
    made = schema.make_row(point, {"cpu_model": "c"}, run_id="r", status="ok", cpu_cores=8)
    assert made["cpu_cores"] == "8" and made["cpu_model"] == "c"
    older = [c for c in schema.COLUMNS if c != "cpu_cores"]
    path = tmp_path / "results.csv"
    path.write_text(",".join(older) + "\n" + ",".join(made[c] for c in older) + "\n")
    assert schema.read_rows(str(path))[0]["cpu_cores"] == ""


def test_a_loopback_sweep_records_this_hosts_cores(write_sweep, tmp_path):
    need_mpirun()
    text = f"""
[sweep]
name = "cores"
[launcher]
program = "{FAKE_TRAIN}"
[fixed]
model = "vgg16"
ranks = 1
batch_size = 64
compute = "replay"
profile = "models/profiles/vgg16-h100-b64.json"
"""
    out = tmp_path / "out"
    result = run_cli("sweep", write_sweep(text), "--out", str(out))
    assert result.returncode == 0, result.stderr
    rows = schema.read_rows(str(out / "results.csv"))
    assert rows and all(r["cpu_cores"] == str(os.cpu_count()) for r in rows)
    page = (out / "report" / "index.html").read_text()
    assert f"host hardware: CPU fake cpu ({os.cpu_count()} cores)" in page
