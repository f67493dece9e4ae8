"""[launcher] kind = "srun": Slurm's srun starts the ranks on the nodes Slurm chooses."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from reports import settings
from reports.launchers import base

_TIME_RE = re.compile(r"^([0-9]+-)?[0-9]+(:[0-9]{2}){0,2}$")
_SLURM_CHOOSES = "(Slurm chooses the nodes; give partition, tasks_per_node and gpus_per_node)"


@dataclass
class SrunLauncher(base.Launcher):
    KIND = "srun"
    KEYS = ("args", "env", "program", "srun", "partition", "tasks_per_node", "gpus_per_node", "time_limit")
    REFUSED = {key: _SLURM_CHOOSES for key in ("mpirun", "hosts", "hostfile")}

    # The command, partition, ranks per node (the GPUs each node trains on), GPUs to ask per node,
    # and the step's time limit (Slurm's format, e.g. "30:00").
    srun: str = "srun"
    partition: str | None = None
    tasks_per_node: int | None = None
    gpus_per_node: int | None = None
    time_limit: str | None = None

    def set(self, key, value, where, root, problems):
        if key in ("srun", "partition", "time_limit"):
            if not isinstance(value, str) or not value:
                problems.append(f"{where} must be a non-empty string")
            elif key == "time_limit" and not _TIME_RE.match(value):
                problems.append(
                    f"{where} = {value!r} is not allowed; allowed: Slurm's time format, "
                    'e.g. "30", "30:00", "2:00:00" or "1-00:00:00"'
                )
            else:
                setattr(self, key, value)
        elif key in ("tasks_per_node", "gpus_per_node"):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1024:
                problems.append(f"{where} = {value!r} is not allowed; allowed: an integer in [1, 1024]")
            else:
                setattr(self, key, value)
        else:
            super().set(key, value, where, root, problems)

    def finish(self, table, problems):
        if self.tasks_per_node is None:
            problems.append('[launcher] kind = "srun" needs tasks_per_node (ranks per node, e.g. 8)')

    def network(self):
        return "physical"

    def nodes_for(self, processes: int) -> int:
        """The nodes srun asks for `processes` ranks."""
        if self.tasks_per_node:
            return max(1, -(-processes // self.tasks_per_node))
        return 1

    def nodes(self, point):
        return self.nodes_for(settings.process_count(point))

    def record_on_stdout(self):
        return True  # rank 0 may run on another node: the record comes back with the output

    def check_point(self, point, label, root, problems):
        base.refuse_mpi_backend(point, label, self.KIND, "srun (no Open MPI world)", problems)
        super().check_point(point, label, root, problems)

    def command(self, point, job):
        processes = settings.process_count(point)
        argv = [self.srun, "--ntasks", str(processes), "--nodes", str(self.nodes_for(processes))]
        argv += ["--ntasks-per-node", str(min(self.tasks_per_node or processes, processes))]
        argv += ["--distribution", "block", "--kill-on-bad-exit=1", "--export", "ALL"]
        if self.partition:
            argv += ["--partition", self.partition]
        if self.gpus_per_node:
            argv += ["--gpus-per-node", str(self.gpus_per_node)]
        if self.time_limit:
            argv += ["--time", self.time_limit]
        return argv + self.args + self.trainer_argv(point, job)

    def check_command(self, program, transport, processes):
        nodes = str(self.nodes_for(processes))
        argv = [self.srun, "--nodes", nodes, "--ntasks", nodes, "--ntasks-per-node", "1"]
        argv += ["--kill-on-bad-exit=0", "--export", "ALL", *self.args]
        return argv + [program, "--check-transport", "--transport", transport]

    def point_env(self, env):
        env = super().point_env(env)
        if "KOLO_JOB_SECRET" not in env:
            # srun passes the environment on; rank 0 serves the rendezvous store with it.
            env["KOLO_JOB_SECRET"] = secrets.token_hex(16)
        return env

    def require_tools(self, kolo_run):
        base.require_command(self.srun, "srun")
