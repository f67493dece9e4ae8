"""The runner's measure of other work on the host: a busy process that is not the point's counts,
the point's own (waited-for) processes do not."""

import os
import subprocess
import sys
import time

import pytest
from reports import hostload

BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc/stat on this host")


def _background(seconds=1.0):
    load = hostload.HostLoad()
    time.sleep(seconds)
    return load.other_cores()


def test_a_neighbours_busy_loop_counts_as_other_work():
    before = _background()
    neighbour = subprocess.Popen([sys.executable, "-c", BUSY.format(s=30)])
    try:
        time.sleep(0.3)
        load = hostload.HostLoad()
        time.sleep(1.5)
        other = load.other_cores()
    finally:
        neighbour.kill()
        neighbour.wait()
    # On a host already full (more busy processes than cores) a neighbour adds less than a core.
    assert other is not None and before is not None
    assert other >= min(before + 0.5, (os.cpu_count() or 1) - 0.3), (before, other)


def test_the_points_own_processes_do_not():
    before = _background()
    load = hostload.HostLoad()
    subprocess.run([sys.executable, "-c", BUSY.format(s=1.5)], check=True)
    other = load.other_cores()
    # The child's CPU is the point's own: what remains is the host's background.
    assert other is not None and before is not None
    assert other < before + 0.5, (before, other)
