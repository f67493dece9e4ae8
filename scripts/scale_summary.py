#!/usr/bin/env python3
"""Summarises scripts/scale-bench's runs: medians over repeats of each row's median time, its
ratio to MPI_Allreduce (mpi-direct) in the same run, and what each rank held.

Usage: scale_summary.py OUT_DIR  (the folder of <part>-<transport|launcher>-<n>-<k>.json files)
"""

import json
import os
import pathlib
import re
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from reports import files

NAME = re.compile(r"^(?P<group>.+)-(?P<n>\d+)-(?P<k>\d+)\.json$")


def load(folder: pathlib.Path):
    groups = defaultdict(list)  # (group, n) -> [doc]
    for path in sorted(folder.glob("*.json")):
        m = NAME.match(path.name)
        if not m:
            continue
        try:
            doc = json.loads(files.read_text(path, "bench JSON", files.RECORD_LIMIT))
        except (OSError, json.JSONDecodeError) as e:
            print(f"# {path.name}: unreadable ({e})")
            continue
        groups[(m["group"], int(m["n"]))].append(doc)
    return groups


def spread(values):
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.3g} ({min(values):.3g}-{max(values):.3g}, {len(values)} runs)"


def times(doc):
    """(bytes, label) -> median time in us, for one run."""
    return {(r["bytes"], r["backend"]): r["time"]["median_us"] for r in doc["rows"]}


def busbw(doc):
    return {(r["bytes"], r["backend"]): r["busbw_gbs"] for r in doc["rows"]}


def summarize_times(name, docs):
    print(f"\n## {name}: median time (us) over runs, and time / mpi-direct's time in the same run")
    labels = []
    for d in docs:
        for r in d["rows"]:
            if r["backend"] not in labels:
                labels.append(r["backend"])
    sizes = sorted({r["bytes"] for d in docs for r in d["rows"]})
    has_mpi = "mpi-direct" in labels
    print(f"{'size(B)':>9} {'row':>26} {'time(us)':>34} {'/ mpi-direct':>34}")
    for b in sizes:
        for label in labels:
            ts = [times(d).get((b, label)) for d in docs]
            ts = [t for t in ts if t is not None]
            if not ts:
                continue
            ratios = []
            if has_mpi and label != "mpi-direct":
                for d in docs:
                    t = times(d)
                    if (b, label) in t and (b, "mpi-direct") in t and t[(b, "mpi-direct")] > 0:
                        ratios.append(t[(b, label)] / t[(b, "mpi-direct")])
            print(f"{b:>9} {label:>26} {spread(ts):>34} {spread(ratios) if ratios else '':>34}")


def summarize_big(name, docs):
    print(f"\n## {name}: 64 MiB bus bandwidth ratios, per run")
    ring_link, ring_mpi = [], []
    for d in docs:
        bw = busbw(d)
        for (b, label), v in bw.items():
            if label == "ring":
                if (b, "link") in bw and bw[(b, "link")] > 0:
                    ring_link.append(v / bw[(b, "link")])
                if (b, "mpi-direct") in bw and bw[(b, "mpi-direct")] > 0:
                    ring_mpi.append(v / bw[(b, "mpi-direct")])
    print(f"ring/link {spread(ring_link)}; ring/mpi-direct {spread(ring_mpi)}")


def summarize_resources(name, n, docs):
    for d in docs:
        res = d.get("rank_resources") or []
        if not res:
            continue
        conns = [r["connections"] for r in res]
        engine_conns = [r["engine_connections"] for r in res]
        mem = [r["engine_transport_memory_bytes"] / 2**20 for r in res]
        own = [max(0, r["peak_rss_bytes"] - r["buffer_bytes"]) / 2**20 for r in res]
        first = [r["first_collective_s"] for r in res]
        print(
            f"{name} n={n}: connections rank 0 {conns[0]}, others max {max(conns[1:] or [0])}; "
            f"engine connections max {max(engine_conns)}; engine transport memory max "
            f"{max(mem):.1f} MiB; peak RSS less buffers median {statistics.median(own):.1f} "
            f"max {max(own):.1f} MiB; first collective after process start max {max(first):.2f} s"
        )


def main():
    folder = pathlib.Path(sys.argv[1])
    groups = load(folder)
    if not groups:
        print(f"no runs in {folder}")
        return 1
    print("# kolo scale-bench summary")
    for (group, n), docs in sorted(groups.items()):
        name = f"{group} ({n} ranks)"
        if group.startswith("big"):
            summarize_big(name, docs)
        else:
            summarize_times(name, docs)
    print("\n## per rank")
    for (group, n), docs in sorted(groups.items()):
        summarize_resources(group, n, docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
