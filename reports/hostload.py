"""How much CPU other work on the host used while a point ran, in cores.

Replay compute sleeps at the recorded pace however busy the host is, while communication needs the
CPU, so a busy neighbour lowers a point's efficiency by more than any tolerance that still catches
a real regression. The runner measures it for every point: the CPU time every process on the host
spent (the busy jiffies of /proc/stat, steal included) minus the CPU time of the point's own
processes (their rusage, collected as the launcher waits for them) and of the runner itself, over
the point's wall time. The gate judges time-based checks only where it was low.
"""

from __future__ import annotations

import os
import resource
import time

from reports import files


def _host_busy_s() -> float | None:
    try:
        text = files.read_text("/proc/stat", "host CPU counters", files.PROC_LIMIT)
        fields = text.split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        u = resource.getrusage(who)
        total += u.ru_utime + u.ru_stime
    return total


class HostLoad:
    """Started at construction; other_cores() reads the cores of other work since then."""

    def __init__(self) -> None:
        self._busy = _host_busy_s()
        self._own = _own_s()
        self._t = time.monotonic()

    def other_cores(self) -> float | None:
        busy = _host_busy_s()
        wall = time.monotonic() - self._t
        if busy is None or self._busy is None or wall <= 0:
            return None
        other = (busy - self._busy) - (_own_s() - self._own)
        return max(0.0, other / wall)
