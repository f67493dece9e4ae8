"""The results CSV: the documented columns, rows from kolo-train's record, appends that survive a
killed writer."""

import csv
import re

import pytest
from reports import schema, settings

from conftest import FIXTURES, ROOT


def test_schema_doc_lists_every_column_in_order():
    doc = (ROOT / "reports" / "SCHEMA.md").read_text()
    documented = re.findall(r"^\| `([a-z_]+)` \|", doc, flags=re.MULTILINE)
    assert tuple(documented) == schema.COLUMNS


def test_fixture_has_the_schema():
    rows = schema.read_rows(str(FIXTURES / "results.csv"))
    assert len(rows) == 49  # 46 points and the 3 models' single-rank baselines
    assert all(r["status"] in schema.STATUSES for r in rows)


RECORD = {
    "kolo_commit": "abc",
    "timestamp": "2026-01-01T00:00:00Z",
    "hosts": ["a", "b"],
    "cpu_model": "cpu",
    "gpu_model": "H100",
    "settings": {
        "model": "vgg16",
        "batch_size": 64,
        "ranks": 4,
        "nodes": 2,
        "backend": "ring",
        "transport": "tcp",
        "ps_servers": 0,
    },
    "results": {
        "total_images_per_sec": 1234.5678,
        "images_per_sec_per_rank": 308.64,
        "images_per_sec_stddev": 2.5,
        "step_time_ms_median": 207.1,
        "final_loss": 6.5,
        "kernel_share": 0.93,
        "engine_stats": {"cycles": 10},
    },
    "status": "ok",
    "error": "",
}


def test_row_from_record():
    point = {"model": "vgg16", "ranks": 4, "backend": "ring", "point_id": "p1", "repeat": 1}
    row = schema.make_row(
        point, RECORD, run_id="r1", status="ok", nodes=1, duration_s=3.25, log="points/p1/log.txt"
    )
    assert list(row) == list(schema.COLUMNS)
    assert row["hosts"] == "a;b"
    assert row["nodes"] == "2"  # the record's, not the launcher's guess
    assert row["batch_size"] == "64"  # kolo-train's default, as it recorded it
    assert row["ps_servers"] == ""  # does not apply to ring
    assert row["total_images_per_sec"] == "1234.57"
    assert row["repeat"] == "1" and row["duration_s"] == "3.25"


def test_ps_pacing_is_a_ps_setting_and_off_reads_as_unpaced():
    ps = dict(RECORD, settings=dict(RECORD["settings"], backend="ps", ps_servers=1, ps_pacing=""))
    base = {"model": "vgg16", "ranks": 4, "backend": "ps", "point_id": "p1", "repeat": 0}
    paced = schema.make_row(dict(base, ps_pacing="125mbit"), ps, run_id="r1", status="ok")
    assert paced["ps_pacing"] == "125mbit"
    for point in (base, dict(base, ps_pacing="off")):
        assert schema.make_row(point, ps, run_id="r1", status="ok")["ps_pacing"] == ""
    ring = {"model": "vgg16", "ranks": 4, "backend": "ring", "point_id": "p2", "repeat": 0}
    ring_row = schema.make_row(dict(ring, ps_pacing="125mbit"), RECORD, run_id="r1", status="ok")
    assert ring_row["ps_pacing"] == ""
    # A ps point's flag, and none for ring.
    assert settings.trainer_args(dict(base, ps_pacing="125mbit"))[-2:] == ["--ps-pacing", "125mbit"]
    assert "--ps-pacing" not in settings.trainer_args(dict(ring, ps_pacing="125mbit"))


def test_allreduce_algorithm_is_a_ring_setting_with_a_column_of_its_own():
    ring = {"model": "vgg16", "ranks": 4, "backend": "ring", "point_id": "p1", "repeat": 0}
    point = dict(ring, allreduce_algorithm="recursive-doubling")
    assert settings.trainer_args(point)[-2:] == ["--allreduce-algorithm", "recursive-doubling"]
    row = schema.make_row(point, RECORD, run_id="r1", status="ok")
    assert row["allreduce_algorithm"] == "recursive-doubling"
    # What ran, from the record, where the point left it to the default.
    rec = dict(RECORD, settings=dict(RECORD["settings"], allreduce_algorithm="auto"))
    assert schema.make_row(ring, rec, run_id="r1", status="ok")["allreduce_algorithm"] == "auto"
    # Not a setting of the other backends.
    ps = dict(ring, backend="ps", allreduce_algorithm="ring")
    assert "--allreduce-algorithm" not in settings.trainer_args(ps)
    assert schema.make_row(ps, RECORD, run_id="r1", status="ok")["allreduce_algorithm"] == ""
    why = settings.BY_NAME["allreduce_algorithm"].check("tree")
    assert why is not None and "recursive-doubling" in why
    assert settings.BY_NAME["allreduce_algorithm"].check("auto") is None


def test_compression_is_a_setting_of_every_communicating_backend_with_its_column():
    ring = {"model": "vgg16", "ranks": 4, "backend": "ring", "point_id": "p1", "repeat": 0}
    for backend in ("ring", "mpi", "ps", "nccl"):
        point = dict(ring, backend=backend, compression="fp16")
        args = settings.trainer_args(point)
        assert args[args.index("--compression") + 1] == "fp16", (backend, args)
        assert schema.make_row(point, RECORD, run_id="r1", status="ok")["compression"] == "fp16"
    # What ran, from the record, where the point left it to the default.
    rec = dict(RECORD, settings=dict(RECORD["settings"], compression="none"))
    assert schema.make_row(ring, rec, run_id="r1", status="ok")["compression"] == "none"
    # The single-rank baseline communicates nothing: no flag, an empty column.
    base = dict(ring, ranks=1, backend="none", compression="bf16")
    assert "--compression" not in settings.trainer_args(base)
    assert schema.make_row(base, RECORD, run_id="r1", status="ok")["compression"] == ""
    why = settings.BY_NAME["compression"].check("fp8")
    assert why is not None and "bf16" in why
    assert settings.BY_NAME["compression"].check("none") is None


def test_tcp_streams_is_a_setting_of_the_backends_on_kolos_transports():
    ring = {"model": "vgg16", "ranks": 4, "backend": "ring", "point_id": "p1", "repeat": 0}
    for backend in ("ring", "ps"):
        point = dict(ring, backend=backend, tcp_streams="4")
        args = settings.trainer_args(point)
        assert args[args.index("--tcp-streams") + 1] == "4", (backend, args)
        assert schema.make_row(point, RECORD, run_id="r1", status="ok")["tcp_streams"] == "4"
    mpi = dict(ring, backend="mpi", tcp_streams="4")
    assert "--tcp-streams" not in settings.trainer_args(mpi)
    assert schema.make_row(mpi, RECORD, run_id="r1", status="ok")["tcp_streams"] == ""
    check = settings.BY_NAME["tcp_streams"].check
    assert check("auto") is None and check("16") is None
    for bad in ("0", "17", "four", 4):
        why = check(bad)
        assert why is not None and "auto" in why, bad
    assert settings.BY_NAME["flow_cap"].check("250mbit") is None
    assert settings.BY_NAME["flow_cap"].check("fast") is not None


def test_autotune_is_a_flag_and_its_choice_fills_the_columns():
    ring = {"model": "vgg16", "ranks": 4, "backend": "ring", "point_id": "p1", "repeat": 0}
    on = dict(ring, autotune="on", fusion_threshold_mb=64.0)
    assert "--autotune" in settings.trainer_args(on)
    assert "--autotune" not in settings.trainer_args(dict(ring, autotune="off"))
    rec = dict(
        RECORD,
        settings=dict(
            RECORD["settings"],
            autotune=True,
            fusion_threshold_mb=16.0,
            cycle_time_ms=2.5,
            allreduce_algorithm="ring",
        ),
    )
    row = schema.make_row(on, rec, run_id="r1", status="ok")
    # What the timed steps ran: the search's choice, not the point's starting threshold.
    assert row["autotune"] == "on"
    assert (row["fusion_threshold_mb"], row["cycle_time_ms"], row["allreduce_algorithm"]) == ("16", "2.5", "ring")
    # Where the hosts allowed it, hierarchical allreduce was a knob too: the layout chosen.
    rec["settings"]["hierarchical_allreduce"] = True
    assert schema.make_row(on, rec, run_id="r1", status="ok")["allreduce"] == "hierarchical"
    rec["settings"]["hierarchical_allreduce"] = False
    assert schema.make_row(on, rec, run_id="r1", status="ok")["allreduce"] == "flat"
    assert settings.BY_NAME["autotune"].check("yes") is not None
    base = dict(ring, ranks=1, backend="none", autotune="on")
    assert "--autotune" not in settings.trainer_args(base)


def test_failed_row_has_no_results_and_one_line_error():
    point = {"model": "vgg16", "ranks": 4, "point_id": "p1", "repeat": 0}
    row = schema.make_row(point, RECORD, run_id="r1", status="failed", error="boom\nsecond line", nodes=1)
    assert row["total_images_per_sec"] == ""
    assert row["error"] == "boom second line"
    with pytest.raises(ValueError):
        schema.make_row(point, None, run_id="r", status="maybe")


def test_append_read_roundtrip_and_torn_last_line(tmp_path):
    path = str(tmp_path / "results.csv")
    point = {"model": "vgg16", "ranks": 1, "point_id": "p1", "repeat": 0}
    schema.append_row(path, schema.make_row(point, RECORD, run_id="r", status="ok"))
    with open(path, "a") as f:
        f.write("r,p2,0,2026")  # a writer killed mid-row
    assert [r["point_id"] for r in schema.read_rows(path)] == ["p1"]
    schema.append_row(
        path,
        schema.make_row(dict(point, point_id="p3"), None, run_id="r", status="failed", error='x, "quoted"'),
    )
    rows = schema.read_rows(path)
    assert [r["point_id"] for r in rows] == ["p1", "p3"]
    assert rows[1]["error"] == 'x, "quoted"'


def test_wrong_header_is_refused(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(schema.SchemaError, match="header is not kolo's results schema"):
        schema.read_rows(str(path))


def test_non_number_is_named():
    with pytest.raises(schema.SchemaError, match="column ranks holds 'four'"):
        schema.number({"ranks": "four", "point_id": "p"}, "ranks")


def test_latest_row_per_point_wins():
    rows = [
        {"point_id": "a", "status": "failed"},
        {"point_id": "b", "status": "ok"},
        {"point_id": "a", "status": "ok"},
    ]
    assert [(r["point_id"], r["status"]) for r in schema.latest_per_point(rows)] == [("b", "ok"), ("a", "ok")]


# The columns of kolo's results files before the time breakdown, the single-rank baseline and the
# network columns.
OLDER = tuple(
    c
    for c in schema.COLUMNS
    if c
    not in (*schema.BREAKDOWN, "baseline_images_per_sec", "efficiency_vs_own_base", *schema.NETWORK_COLUMNS)
)


def write_older(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=OLDER, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def test_an_earlier_kolos_file_reads_with_the_new_columns_empty(tmp_path):
    rows = schema.read_rows(str(FIXTURES / "results.csv"))
    path = tmp_path / "older.csv"
    write_older(path, rows)
    again = schema.read_rows(str(path))
    assert len(again) == len(rows) and list(again[0]) == list(schema.COLUMNS)
    assert again[0]["total_images_per_sec"] == rows[0]["total_images_per_sec"]
    assert all(r["forward_ms"] == "" and r["baseline_images_per_sec"] == "" for r in again)


@pytest.mark.parametrize(
    "header",
    [
        ("surprise", *OLDER),  # a column kolo never had
        tuple(reversed(OLDER)),  # out of order
        tuple(c for c in OLDER if c != "model"),  # a setting missing
    ],
)
def test_other_headers_are_still_refused(tmp_path, header):
    path = tmp_path / "bad.csv"
    path.write_text(",".join(header) + "\n")
    with pytest.raises(schema.SchemaError, match="header is not kolo's results schema"):
        schema.read_rows(str(path))


def test_an_earlier_kolos_rows_are_loopback_or_physical_and_undilated(tmp_path):
    rows = schema.read_rows(str(FIXTURES / "results.csv"))
    assert "network" not in schema.header_of(str(FIXTURES / "results.csv"))
    assert {(r["network"], r["dilation"]) for r in rows} == {("loopback", "1")}
    assert all(r["link"] == r["link_represented"] == r["ranks_per_host"] == "" for r in rows)
    # A row of an earlier file that spanned two hosts ran on their own network.
    rows[0]["nodes"] = "2"
    path = tmp_path / "older.csv"
    write_older(path, rows)
    again = schema.read_rows(str(path))
    assert (again[0]["network"], again[1]["network"]) == ("physical", "loopback")


def test_an_emulated_row_says_its_link_and_what_it_stands_for():
    point = {
        "model": "vgg16",
        "ranks": 4,
        "hosts": 4,
        "ranks_per_host": 1,
        "link": "1gbit",
        "delay_us": 0,
        "dilation": 25,
        "point_id": "p",
        "repeat": 0,
    }
    record = dict(RECORD, settings=dict(RECORD["settings"], dilation=25, nodes=4))
    row = schema.make_row(point, record, run_id="r", status="ok", network="emulated")
    assert (row["network"], row["link"], row["link_represented"], row["dilation"]) == (
        "emulated",
        "1gbit",
        "25gbit",
        "25",
    )
    assert (row["nodes"], row["ranks_per_host"], row["delay_us"]) == ("4", "1", "0")
    # Over loopback the network columns stay empty, and an undilated run says 1.
    plain = schema.make_row({"model": "vgg16", "ranks": 2, "point_id": "q"}, RECORD, run_id="r", status="ok")
    assert (plain["network"], plain["link"], plain["link_represented"], plain["dilation"]) == (
        "loopback",
        "",
        "",
        "1",
    )
    with pytest.raises(ValueError, match="network 'wifi'"):
        schema.make_row(point, record, run_id="r", status="ok", network="wifi")


def test_allreduce_layout_is_a_measured_setting_too():
    ring = {"model": "resnet101", "ranks": 16, "backend": "ring"}
    assert "--hierarchical-allreduce" in settings.trainer_args(dict(ring, allreduce="hierarchical"))
    assert "--hierarchical-allreduce" not in settings.trainer_args(dict(ring, allreduce="flat"))
    assert "allreduce" not in settings.SIM_ONLY_SETTINGS
    assert "framework" in settings.SIM_ONLY_SETTINGS
