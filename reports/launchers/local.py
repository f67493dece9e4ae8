"""[launcher] kind = "local": kolo-run starts every rank on this host, over loopback, without MPI."""

from __future__ import annotations

from dataclasses import dataclass

from reports import settings
from reports.launchers import base

# kolo-run's --bind-to (mpirun takes its own --bind-to in args).
BIND_TO = ("none", "core", "hwthread")
_ONE_HOST = '(kolo-run starts every rank on this host); use kind = "mpirun"'


@dataclass
class LocalLauncher(base.Launcher):
    KIND = "local"
    KEYS = ("env", "program", "bind_to")
    REFUSED = {key: _ONE_HOST for key in ("mpirun", "args", "hosts", "hostfile")}

    # What kolo-run binds each rank to (BIND_TO); None leaves kolo-run's default.
    bind_to: str | None = None

    def set(self, key, value, where, root, problems):
        if key != "bind_to":
            super().set(key, value, where, root, problems)
        elif value not in BIND_TO:
            problems.append(
                f"{where} = {value!r} is not allowed; allowed: " + ", ".join(f'"{b}"' for b in BIND_TO)
            )
        else:
            self.bind_to = value

    @classmethod
    def elsewhere(cls, key, kind):
        return (
            f'[launcher] {key} is allowed only with kind = "local" (kolo-run\'s --bind-to; kind is '
            f'"{kind}": mpirun takes --bind-to in args)'
        )

    def is_local(self) -> bool:
        return True

    def network(self):
        return "loopback"

    def check_point(self, point, label, root, problems):
        base.refuse_mpi_backend(point, label, self.KIND, "kolo-run", problems)
        super().check_point(point, label, root, problems)

    def command(self, point, job):
        np_ = str(settings.process_count(point))
        argv = [job.kolo_run, "-np", np_, "--timeout-s", str(int(job.timeout_s) + 1)]
        if self.bind_to:
            argv += ["--bind-to", self.bind_to]
        return argv + ["--", *self.trainer_argv(point, job)]

    def check_command(self, program, transport, processes):
        return [program, "--check-transport", "--transport", transport]

    def require_tools(self, kolo_run):
        base.require_executable(kolo_run, 'kolo-run ([launcher] kind = "local")')
