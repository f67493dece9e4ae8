"""Where each process of a point runs under mpirun across hosts, and where its parameter servers go.

mpirun's by-slot mapping fills each host named in -H with as many processes as its slots before
the next. A point's workers are the GPUs (the [launcher] hosts' slots); its parameter servers are
extra processes, placed by the setting ps_hosts:

- "spread": one server per worker host beside its workers (tf_cnn_benchmarks' distributed runs
  placed them so), the servers numbered after the workers of their host; more servers than worker
  hosts go round the worker hosts again.
- "dedicated": servers on hosts of their own, after the workers' hosts, one per host while hosts
  last, then round them again.

The point's -H list is built for exactly its processes, and kolo-train is told which ranks serve
(--ps-server-ranks), so that the placement does not depend on the slot counts lining up.
"""

from __future__ import annotations

from dataclasses import dataclass

from reports import settings

PS_HOSTS = settings.PS_HOSTS


@dataclass
class Placement:
    hosts: list[tuple[str, int]]  # the -H list: (host, processes on it), in rank order
    server_ranks: list[int]  # ranks that serve parameters (empty without servers)
    lines: list[str]  # one per host: "node01: ranks 0-7 workers, rank 8 server"

    def host_arg(self) -> str:
        return ",".join(f"{h}:{n}" for h, n in self.hosts)


def _span(ranks: list[int]) -> str:
    if not ranks:
        return ""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def plan(point: dict, hosts: list[tuple[str, int | None]]) -> tuple[Placement | None, str | None]:
    """The placement of `point` on `hosts` (host, slots), or (None, why not). Needs every host's
    slots: they are the workers each host takes."""
    if not hosts or any(s is None for _, s in hosts):
        return None, "needs [launcher] hosts (or a hostfile) with slots for every host, e.g. node01:8"
    workers = point["ranks"]
    servers = point.get("ps_servers", 1) if point.get("backend") == "ps" else 0
    mode = point.get("ps_hosts", "spread") if servers else None
    per_host_workers: list[int] = []
    left = workers
    for _, slots in hosts:
        if left == 0:
            break
        take = min(slots, left)
        per_host_workers.append(take)
        left -= take
    if left > 0:
        total = sum(s for _, s in hosts)
        return None, f"needs {workers} worker slots but the hosts give {total}"
    used = len(per_host_workers)
    per_host_servers = [0] * len(hosts)
    if servers:
        if mode == "spread":
            targets = list(range(used))
        else:
            targets = list(range(used, len(hosts)))
            if not targets:
                return None, (
                    f'ps_hosts = "dedicated" needs hosts beyond the {used} that the {workers} '
                    f"workers fill, and the host list has {len(hosts)}"
                )
        for i in range(servers):
            per_host_servers[targets[i % len(targets)]] += 1
    placement = Placement([], [], [])
    rank = 0
    for i, (host, _) in enumerate(hosts):
        w = per_host_workers[i] if i < used else 0
        s = per_host_servers[i]
        if w + s == 0:
            continue
        worker_ranks = list(range(rank, rank + w))
        server_ranks = list(range(rank + w, rank + w + s))
        rank += w + s
        placement.hosts.append((host, w + s))
        placement.server_ranks += server_ranks
        parts = []
        if worker_ranks:
            parts.append(f"{_span(worker_ranks)} worker{'s' if w > 1 else ''}")
        if server_ranks:
            parts.append(f"{_span(server_ranks)} server{'s' if s > 1 else ''}")
        placement.lines.append(f"{host}: " + ", ".join(parts))
    assert rank == settings.process_count(point)
    return placement, None
