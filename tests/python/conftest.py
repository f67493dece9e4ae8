"""Shared helpers for the tests of kolo's sweeps and reports (the reports package)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAKE_TRAIN = FIXTURES / "fake_kolo_train.py"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def write_sweep(tmp_path):
    """Writes TOML text to a file in tmp_path and returns its path."""

    def write(text: str, name: str = "sweep.toml") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


def need_mpirun():
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (scripts/bootstrap installs openmpi-bin)")


def build_lacks(bin_dir, *parts: str) -> list[str]:
    """The optional parts among PARTS (MPI, ONEDNN, ...: KOLO_HAVE_<PART>) that the build whose
    bin directory is BIN_DIR was configured without, read from its generated kolo/config.h."""
    config = Path(bin_dir).parent / "generated" / "kolo" / "config.h"
    text = config.read_text() if config.exists() else ""
    return [p for p in parts if f"#define KOLO_HAVE_{p} 1" not in text]


def need_build(bin_dir, *parts: str):
    """Skips, naming them, when the build at BIN_DIR lacks any of PARTS."""
    lacking = build_lacks(bin_dir, *parts)
    if lacking:
        pytest.skip(f"the build in {bin_dir} has no {', '.join(lacking)} (see its configure summary)")


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `python -m reports.cli ARGS` as scripts/* do, and returns the finished process."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), KOLO_SKIP_BUILD="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "reports.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
