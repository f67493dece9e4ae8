"""scripts/timeline-merge: per-rank timelines shifted onto one clock by their monotonic starts;
bad files refused by name. Both it and scripts/timeline-overlap read a file cut at a page boundary
(reports/timelinefile.py)."""

import json
import subprocess
import sys

from conftest import ROOT

MERGE = ROOT / "scripts" / "timeline-merge"


def trace(rank, start_us, events):
    meta = {
        "name": "process_name",
        "ph": "M",
        "pid": rank,
        "tid": 0,
        "args": {"name": f"rank {rank}", "monotonic_start_us": start_us},
    }
    return {"traceEvents": [meta] + [dict(e, pid=rank) for e in events]}


def run(*args):
    return subprocess.run(
        [sys.executable, str(MERGE), *map(str, args)], capture_output=True, text=True, timeout=60
    )


def test_events_are_shifted_onto_the_earliest_start(tmp_path):
    # Rank 1 started 2.5 ms after rank 0: its event at its own 1000 us is at 3500 us on rank 0's clock.
    a = tmp_path / "t.json"
    b = tmp_path / "t.rank1.json"
    a.write_text(json.dumps(trace(0, 10_000, [{"name": "PS_PUSH", "ph": "B", "ts": 3000, "tid": 1}])))
    b.write_text(json.dumps(trace(1, 12_500, [{"name": "PS_PULL", "ph": "E", "ts": 1000, "tid": 1}])))
    out = tmp_path / "merged.json"
    p = run("--out", out, b, a)
    assert p.returncode == 0, p.stderr
    events = json.loads(out.read_text())["traceEvents"]
    ts = {e["name"]: e["ts"] for e in events if "ts" in e}
    assert ts == {"PS_PUSH": 3000, "PS_PULL": 3500}
    # Metadata kept, one process per rank.
    assert sorted(e["pid"] for e in events if e["name"] == "process_name") == [0, 1]

    # --unaligned only concatenates.
    p = run("--unaligned", "--out", out, a, b)
    assert p.returncode == 0, p.stderr
    ts = {e["name"]: e["ts"] for e in json.loads(out.read_text())["traceEvents"] if "ts" in e}
    assert ts == {"PS_PUSH": 3000, "PS_PULL": 1000}


def test_bad_files_are_refused_by_name(tmp_path):
    good = tmp_path / "t.json"
    good.write_text(json.dumps(trace(0, 5, [])))
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"traceEvents": [{"name": "process_name", "ph": "M", "pid": 2, "args": {}}]}))
    out = tmp_path / "m.json"
    for bad, words in ((garbage, "garbage.json"), (old, "monotonic_start_us"), (good, "same rank")):
        p = run("--out", out, good, bad)
        assert p.returncode == 1, (bad, p.stdout)
        assert words in p.stderr, p.stderr
    p = run("--out", out, tmp_path / "missing.json")
    assert p.returncode == 1 and "missing.json" in p.stderr


def test_a_file_cut_at_a_page_boundary_is_read_without_its_partial_event(tmp_path):
    # What a SIGKILL mid-write can leave: the document up to a 4096-byte boundary, inside an event,
    # then the spaces reserved ahead. It is read without that event; a cut elsewhere is refused.
    events = [{"name": "STEP", "ph": "B", "ts": i, "tid": 1, "args": {"i": i}} for i in range(200)]
    text = json.dumps(trace(0, 7, events), indent=None).replace("}, {", "},\n{")
    cut = 4096
    assert len(text) > cut + 100
    cut_file = tmp_path / "cut.json"
    cut_file.write_text(text[:cut] + " " * 5000)
    out = tmp_path / "m.json"
    p = run("--out", out, cut_file)
    assert p.returncode == 0, p.stderr
    assert "cut at byte 4096" in p.stderr
    got = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "B"]
    assert 0 < len(got) < 200
    assert [e["args"]["i"] for e in got] == list(range(len(got)))

    cut_file.write_text(text[: cut + 7] + " " * 5000)
    p = run("--out", out, cut_file)
    assert p.returncode == 1 and "cut.json" in p.stderr


OVERLAP = ROOT / "scripts" / "timeline-overlap"


def test_timeline_overlap_reads_a_file_cut_at_a_page_boundary(tmp_path):
    # A training timeline (4 gradients, each queued and allreduced once a step) cut inside an
    # event at a 4096-byte boundary: timeline-overlap reads the steps before the cut and says so;
    # a cut elsewhere is refused, naming the file.
    events = [{"name": "thread_name", "ph": "M", "tid": t, "args": {"name": f"grad{t}"}} for t in range(1, 5)]
    for step in range(60):
        base = 1000 * step
        for t in range(1, 5):
            events.append({"name": "QUEUE", "ph": "B", "ts": base + 10 * t, "tid": t})
            events.append({"name": "ALLREDUCE", "ph": "B", "ts": base + 30 + 10 * t, "tid": t})
            events.append({"name": "ALLREDUCE", "ph": "E", "ts": base + 60 + 10 * t, "tid": t})
    text = json.dumps(trace(0, 7, events), separators=(",", ":")).replace("},{", "},\n{")
    assert len(text) > 3 * 4096 and text[2 * 4096 - 1] != " "
    cut_file = tmp_path / "cut.json"
    cut_file.write_text(text[: 2 * 4096] + " " * 5000)
    p = subprocess.run(
        [sys.executable, str(OVERLAP), "--json", str(cut_file)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert "timeline-overlap: " in p.stderr and "cut at byte 8192" in p.stderr
    steps = json.loads(p.stdout)["ranks"][0]["steps"]
    assert 0 < steps < 60

    cut_file.write_text(text[: 2 * 4096 + 5] + " " * 5000)
    p = subprocess.run(
        [sys.executable, str(OVERLAP), str(cut_file)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 1 and "cannot read" in p.stderr and "cut.json" in p.stderr
