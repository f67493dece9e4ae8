#!/usr/bin/env python3
"""The engine's layering, checked on its sources: every `#include "engine/..."` in a layer's
folders must name a header of the same layer or of a layer it links (engine/CMakeLists.txt
declares the layers; configuring writes build/generated/kolo/engine_layers.txt, one line per
folder: `folder=layer:allowed,layers`).

A folder the map does not name (one whose optional part this build left out, e.g. backends/nccl)
belongs to its nearest named ancestor.

    check_layers.py MAP ENGINE_DIR   exit 0 when every include is allowed, 1 naming each one not
    check_layers.py --self-test      checks this checker on a made-up tree with known violations
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+"engine/([^"]+)"', re.M)


def read_map(path: Path) -> dict[str, tuple[str, set[str]]]:
    layers = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        folder, _, rest = line.partition("=")
        layer, _, allowed = rest.partition(":")
        layers[folder.strip()] = (layer.strip(), {a for a in allowed.split(",") if a})
    return layers


def owner(folder: str, layers: dict) -> str | None:
    """The map's folder that `folder` (relative to engine/, "." for engine/ itself) belongs to."""
    while True:
        if folder in layers:
            return folder
        if folder in (".", ""):
            return None
        folder = str(Path(folder).parent)


def violations(layers: dict, engine: Path) -> list[str]:
    found = []
    for path in sorted(engine.rglob("*")):
        if path.suffix not in (".h", ".cc", ".cu") or not path.is_file():
            continue
        folder = owner(str(path.parent.relative_to(engine)), layers)
        if folder is None:
            found.append(f"engine/{path.relative_to(engine)}: its folder is in no layer")
            continue
        layer, allowed = layers[folder]
        for header in INCLUDE.findall(path.read_text(errors="replace")):
            target = owner(str(Path(header).parent), layers)
            if target is None:
                found.append(f"engine/{path.relative_to(engine)} includes engine/{header}: in no layer")
                continue
            other = layers[target][0]
            if other != layer and other not in allowed:
                found.append(
                    f"engine/{path.relative_to(engine)} (layer {layer}) includes engine/{header} "
                    f"(layer {other}); {layer} may include only "
                    f"{', '.join(sorted(allowed)) or 'its own headers'}"
                )
    return found


def self_test() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "map.txt").write_text("common=common:\ntransport=transport:common\nbackends=backends:transport,common\n")
        files = {
            "common/status.h": '#include "engine/common/other.h"\n',
            "common/bad.cc": '#include "engine/transport/transport.h"\n',  # up: a violation
            "transport/tcp/pair.cc": '#include "engine/common/status.h"\n#include "engine/transport/transport.h"\n',
            "backends/nccl/nccl.cc": '#include "engine/transport/transport.h"\n',
            "backends/ring.cc": '#  include "engine/backends/nccl/x.h"\n',
            "orphan/x.cc": "",  # a folder in no layer
        }
        for name, text in files.items():
            (root / "engine" / name).parent.mkdir(parents=True, exist_ok=True)
            (root / "engine" / name).write_text(text)
        found = violations(read_map(root / "map.txt"), root / "engine")
        expected = ["engine/common/bad.cc (layer common) includes engine/transport/transport.h", "engine/orphan/x.cc"]
        ok = len(found) == 2 and all(any(e in f for f in found) for e in expected)
        print("self-test:", "ok" if ok else f"FAILED, found {found}")
        return 0 if ok else 1


def main(argv: list[str]) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    layers = read_map(Path(argv[1]))
    found = violations(layers, Path(argv[2]))
    for v in found:
        print(v)
    names = sorted({layer for layer, _ in layers.values()})
    print(f"engine layers: {len(layers)} folders in {len(names)} layers; {len(found)} include(s) against the direction")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
