"""[launcher] kind = "cluster": every rank on an emulated host of this machine (reports.cluster,
scripts/cluster), behind a shaped link; over loopback instead where no emulated network can be made
and fallback = "mpirun" allows it."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from reports import cluster, launch, settings
from reports.launchers import base, mpirun

# What may stand in where scripts/cluster check fails.
FALLBACKS = ("mpirun",)
_OWN_HOSTS = (
    "(scripts/cluster runs mpirun inside its first host over its own hosts; give the network as "
    "the settings hosts, ranks_per_host, link and delay_us)"
)
# What a cluster sweep's fallback means for its comparison, said on screen and in the report.
LOOPBACK_MEANING = (
    "every rank on this host, so the ranks share its {cores} core(s), and this host's CPU, not a "
    "network, limits the multi-rank points"
)


@dataclass
class ClusterLauncher(base.Launcher):
    KIND = "cluster"
    KEYS = ("args", "env", "program", "fallback")
    REFUSED = {key: _OWN_HOSTS for key in ("mpirun", "hosts", "hostfile")}

    # "mpirun" to run over loopback on this host where no emulated network can be made
    # (scripts/cluster check fails), without the network's settings; None to refuse.
    fallback: str | None = None

    def set(self, key, value, where, root, problems):
        if key != "fallback":
            super().set(key, value, where, root, problems)
        elif value not in FALLBACKS:
            problems.append(
                f"{where} = {value!r} is not allowed; allowed: "
                + ", ".join(f'"{k}"' for k in FALLBACKS)
                + " (run over loopback where no emulated network can be made)"
            )
        else:
            self.fallback = value

    def network(self):
        return "emulated"

    def nodes(self, point):
        return point["hosts"]

    def shape_point(self, point, label, problems):
        """The point with its emulated network spelled out: ranks_per_host (default 1), hosts
        (default ranks / ranks_per_host; given, hosts x ranks_per_host must be ranks) and delay_us
        (default 0); link must be given."""
        out = dict(point)
        rph = out.setdefault("ranks_per_host", 1)
        ranks = out.get("ranks", 0)
        if "link" not in out:
            problems.append(
                f'point {label}: [launcher] kind = "cluster" needs link, the rate of every emulated '
                'host\'s link (e.g. link = "1gbit" in [fixed] or [matrix])'
            )
        if "hosts" in out:
            if out["hosts"] * rph != ranks:
                problems.append(
                    f"point {label}: hosts = {out['hosts']} x ranks_per_host = {rph} is "
                    f"{out['hosts'] * rph} workers, but ranks = {ranks}; hosts x ranks_per_host must "
                    "be ranks (leave hosts out to have it worked out)"
                )
        elif ranks % rph:
            problems.append(
                f"point {label}: ranks = {ranks} is not a multiple of ranks_per_host = {rph}; allowed: "
                "ranks that fill whole hosts"
            )
        else:
            out["hosts"] = ranks // rph
        out.setdefault("delay_us", 0)
        return dict(settings.normalize(out), repeat=point["repeat"])

    def baseline_settings(self, point):
        # One emulated host with the link of the point it was made for (it sends nothing over it).
        return {
            **{k: point[k] for k in ("link", "delay_us", "flow_cap") if k in point},
            "hosts": 1,
            "ranks_per_host": 1,
        }

    def check_point(self, point, label, root, problems):
        base.refuse_ps_hosts(point, label, self.KIND, problems)
        base.refuse_settings(point, label, self.KIND, settings.SIM_ONLY_SETTINGS, "sim", problems)
        check_size(point, label, problems)

    def shapes(self, points):
        return cluster.plan(points)

    def command(self, point, job):
        if job.cluster_name is None or job.cluster_script is None:
            raise ValueError('kind "cluster" needs the cluster\'s name and scripts/cluster')
        argv = [job.cluster_script, "mpirun", "--name", job.cluster_name]
        argv += ["--ranks-per-host", str(point.get("ranks_per_host", 1)), "--"]
        argv += ["-np", str(settings.process_count(point))]
        # Every point's processes carry its token; mpirun passes it on to the ranks (the other
        # hosts' daemons start with a clean environment). scripts/cluster adds its own flags for
        # the cluster's subnet.
        argv += [*mpirun.NO_BINDING, "-x", launch.TOKEN_VAR]
        return argv + mpirun.exported(self.env) + self.args + self.trainer_argv(point, job)

    def require_tools(self, kolo_run):
        base.require_executable(cluster.SCRIPT, 'scripts/cluster ([launcher] kind = "cluster")')

    def ready_here(self, sweep, found=None):
        """Where scripts/cluster check fails (`found`: its answer, asked here when None) the sweep
        runs over loopback with fallback = "mpirun" (on_loopback), else that is a problem; a delay
        where the kernel cannot emulate one is a problem too."""
        found = found or cluster.check()
        if not found.ok:
            if self.fallback == "mpirun":
                note = (
                    f"no emulated network here ({found.text}); running over loopback instead "
                    f"([launcher] fallback): " + LOOPBACK_MEANING.format(cores=os.cpu_count() or "?")
                )
                return on_loopback(sweep), note, []
            return (
                sweep,
                None,
                [
                    f'[launcher] kind = "cluster": this machine cannot host an emulated network: '
                    f'{found.text} (scripts/cluster check; set [launcher] fallback = "mpirun" to run '
                    "over loopback instead)"
                ],
            )
        problems = []
        if not found.netem:
            delays = sorted({p["delay_us"] for p in sweep.points if p.get("delay_us")})
            if delays:
                problems.append(
                    f"delay_us = {', '.join(map(str, delays))}: this kernel cannot emulate a delay "
                    f"({found.text}); allowed here: 0 (leave delay_us out)"
                )
        return sweep, None, problems


def check_size(point: dict, label: str, problems: list[str]) -> None:
    """A point's emulated hosts, its parameter servers' included, fit what scripts/cluster makes."""
    if "hosts" in point and cluster.cluster_hosts(point) > cluster.MAX_HOSTS:
        problems.append(
            f"point {label}: needs {cluster.cluster_hosts(point)} emulated hosts (hosts = {point['hosts']}"
            + (" and its parameter servers'" if cluster.cluster_hosts(point) > point["hosts"] else "")
            + f"); scripts/cluster makes at most {cluster.MAX_HOSTS}"
        )


def on_loopback(sweep):
    """A cluster sweep (a sweepfile.Sweep) as fallback = "mpirun" runs it where no emulated network
    can be made: every rank on this host over loopback, without the network's settings (hosts,
    ranks_per_host, link, delay_us) or time dilation, which without a slowed network would make
    the communication look faster than it is. Points that become the same are merged."""
    drop = (*settings.CLUSTER_SETTINGS, "dilation")
    was = sweep.launcher
    launcher = mpirun.MpirunLauncher(env=was.env, args=was.args, program=was.program)
    seen: set[str] = set()
    points = []
    for p in sweep.points:
        base_point = settings.normalize({k: v for k, v in p.items() if k not in drop})
        point = dict(base_point, repeat=p["repeat"])
        point["point_id"] = settings.point_id(point)
        if point["point_id"] not in seen:
            seen.add(point["point_id"])
            points.append(point)
    axes = [a for a in sweep.axes if a not in drop]
    return replace(sweep, launcher=launcher, points=points, axes=axes)
