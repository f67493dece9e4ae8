"""The [launcher] kinds of a sweep file, one module each behind reports.launchers.base.Launcher,
and the registry that maps a kind to its module.

A new kind is a module here with one Launcher subclass, added to _ORDER below; nothing else of
reports/ names a kind.
"""

from __future__ import annotations

from reports.launchers import cluster, local, mpirun, sim, srun
from reports.launchers.base import Launcher

# The kinds in the order messages list them; the first is the default.
_ORDER = (
    mpirun.MpirunLauncher,
    local.LocalLauncher,
    cluster.ClusterLauncher,
    srun.SrunLauncher,
    sim.SimLauncher,
)
KINDS: dict[str, type[Launcher]] = {cls.KIND: cls for cls in _ORDER}
DEFAULT_KIND = _ORDER[0].KIND
# Every key a [launcher] table may have, under one kind or another.
KEYS = ("kind", *dict.fromkeys(key for cls in _ORDER for key in cls.KEYS))

__all__ = ["DEFAULT_KIND", "KEYS", "KINDS", "Launcher", "make", "parse"]


def make(kind: str = DEFAULT_KIND, **fields) -> Launcher:
    """A launcher of `kind` with `fields` set (the keys of its table, parsed)."""
    return KINDS[kind](**fields)


def parse(table: dict, root: str, problems: list[str]) -> Launcher:
    """The launcher of a [launcher] table; what is wrong with it goes to `problems`. Relative
    paths in it are taken from the repository root `root`."""
    kind = table.get("kind", DEFAULT_KIND)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    launcher = (cls or KINDS[DEFAULT_KIND])()
    for key, value in table.items():
        where = f"[launcher] {key}"
        if key not in KEYS:
            problems.append(f"unknown key {where}; allowed: {', '.join(KEYS)}")
        elif key == "kind":
            if cls is None:
                kinds = ", ".join(f'"{k}"' for k in KINDS)
                problems.append(f"{where} = {value!r} is not allowed; allowed: {kinds}")
        elif key in launcher.KEYS:
            launcher.set(key, value, where, root, problems)
        else:
            problems.append(_refusal(launcher, key))
    launcher.finish(table, problems)
    return launcher


def _refusal(launcher: Launcher, key: str) -> str:
    """Why `launcher` refuses `key`, a key of other kinds: its own reason, else the owner's."""
    if key in launcher.REFUSED:
        return f'[launcher] {key} is not allowed with kind = "{launcher.KIND}" {launcher.REFUSED[key]}'
    owners = [cls for cls in _ORDER if key in cls.KEYS]
    if len(owners) == 1:
        return owners[0].elsewhere(key, launcher.KIND)
    kinds = " or ".join(f'"{cls.KIND}"' for cls in owners)
    return f'[launcher] {key} is allowed only with kind = {kinds} (kind is "{launcher.KIND}")'
