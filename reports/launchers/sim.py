"""[launcher] kind = "sim": kolo-sim predicts each point from its replay profile; nothing is
launched on hosts."""

from __future__ import annotations

import os
from dataclasses import dataclass

from reports.launchers import base, cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NOTHING_LAUNCHED = "(kolo-sim predicts each point; nothing is launched on hosts)"


@dataclass
class SimLauncher(base.Launcher):
    KIND = "sim"
    KEYS = ("program",)
    REFUSED = {key: _NOTHING_LAUNCHED for key in ("mpirun", "args", "hosts", "hostfile", "env")}
    PROGRAM = "kolo-sim"
    PROGRAM_WHAT = 'the simulator (kolo-sim, [launcher] kind = "sim")'

    def network(self):
        return "simulated"

    def nodes(self, point):
        return point["ranks"] // point.get("ranks_per_host", 1)

    def baseline_settings(self, point):
        return {**{k: point[k] for k in ("link", "calibration") if k in point}, "ranks_per_host": 1}

    def check_point(self, point, label, root, problems):
        """A point kolo-sim can predict: replay compute (the profile's layer times), whole hosts, no
        emulated-only settings, a calibration file that exists."""
        if point.get("compute") != "replay":
            problems.append(
                f'point {label}: [launcher] kind = "sim" predicts from a replay profile; it needs '
                f'compute = "replay" and a profile (compute is {point.get("compute", "not set")!r})'
            )
        for key in ("hosts", "delay_us", "flow_cap"):
            if key in point:
                problems.append(
                    f'point {label}: {key} is not allowed with kind = "sim" (hosts are ranks / '
                    "ranks_per_host; the simulated links have no added delay; a per-stream cap is "
                    "the calibration's tcp.stream_gbit)"
                )
        rph = point.get("ranks_per_host", 1)
        if point.get("ranks", 1) % rph:
            problems.append(
                f"point {label}: ranks = {point.get('ranks')} is not a multiple of ranks_per_host = "
                f"{rph}; allowed: ranks that fill whole hosts"
            )
        if "calibration" in point:
            cal = point["calibration"]
            full = cal if os.path.isabs(cal) else os.path.join(root, cal)
            if not os.path.isfile(full):
                problems.append(f"point {label}: calibration {full} does not exist")
        cluster.check_size(point, label, problems)

    def command(self, point, job):
        """kolo-sim predict with kolo-train's arguments for `point` and the prediction's own
        settings (calibration taken from the repository root when relative)."""
        # kolo-sim takes the ring layout as --allreduce (below), not kolo-train's flag.
        train = [a for a in self.trainer_args(point, job) if a != "--hierarchical-allreduce"]
        argv = [job.program, "predict", *train, "--ranks", str(point["ranks"])]
        argv += ["--ranks-per-host", str(point.get("ranks_per_host", 1))]
        if "link" in point:
            argv += ["--link", point["link"]]
        if "calibration" in point:
            cal = point["calibration"]
            argv += ["--calibration", cal if os.path.isabs(cal) else os.path.join(ROOT, cal)]
        if "gpu_rate" in point:
            argv += ["--gpu-rate", f"{point['gpu_rate']:g}"]
        if "step_jitter" in point:
            argv += ["--step-jitter", f"{point['step_jitter']:g}"]
        if "allreduce" in point:
            argv += ["--allreduce", point["allreduce"]]
        if "framework" in point:
            argv += ["--framework", point["framework"]]
        if "ps_hosts" in point:
            argv += ["--ps-hosts", point["ps_hosts"]]
        return argv + ["--json", job.json_path]
