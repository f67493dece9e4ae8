"""The [launcher] kinds as modules behind one interface (reports/launchers/): the registry, what
each kind says of itself, and the loopback mpirun flags that scripts/lib.sh repeats."""

import re
import shlex

import pytest
from reports import launch, launchers
from reports.launchers import base, mpirun

from conftest import ROOT


def lib_sh_mpirun_args() -> tuple[str, ...]:
    """KOLO_MPIRUN_ARGS=( ... ) of scripts/lib.sh, as bash splits it."""
    text = (ROOT / "scripts" / "lib.sh").read_text()
    m = re.search(r"^KOLO_MPIRUN_ARGS=\((.*?)\)", text, flags=re.MULTILINE | re.DOTALL)
    assert m, "scripts/lib.sh no longer sets KOLO_MPIRUN_ARGS=(...)"
    return tuple(shlex.split(m.group(1), comments=True))


def test_the_loopback_flags_are_the_same_in_python_and_in_scripts_lib_sh():
    assert lib_sh_mpirun_args() == mpirun.LOOPBACK_ARGS


def test_a_loopback_mpirun_command_carries_the_loopback_flags_once():
    point = {"model": "vgg16", "ranks": 2, "point_id": "x", "repeat": 0}
    argv = launch.command(point, launchers.make("mpirun"), "kt", "kr", "r.json", 60, None)
    start = argv.index(mpirun.LOOPBACK_ARGS[0])
    assert tuple(argv[start : start + len(mpirun.LOOPBACK_ARGS)]) == mpirun.LOOPBACK_ARGS
    assert argv.count("--oversubscribe") == 1 and argv[start + len(mpirun.LOOPBACK_ARGS) :][:2] == [
        "--bind-to",
        "none",
    ]


def test_the_registry_maps_each_kind_to_its_module():
    assert list(launchers.KINDS) == ["mpirun", "local", "cluster", "srun", "sim"]
    for kind, cls in launchers.KINDS.items():
        assert kind == cls.KIND and issubclass(cls, base.Launcher)
        assert cls.__module__ == f"reports.launchers.{kind}"
        assert set(cls.KEYS) <= set(launchers.KEYS)
        assert launchers.make(kind).kind == kind


@pytest.mark.parametrize(
    ("kind", "network"),
    [
        ("mpirun", "loopback"),
        ("local", "loopback"),
        ("cluster", "emulated"),
        ("srun", "physical"),
        ("sim", "simulated"),
    ],
)
def test_each_kind_names_its_network(kind, network):
    launcher = launchers.make(kind)
    assert launcher.network() == network
    assert launcher.ranks_on_this_host() == (network in ("loopback", "emulated"))


def test_every_key_of_another_kind_is_refused_with_a_reason():
    for kind, cls in launchers.KINDS.items():
        for key in launchers.KEYS:
            if key == "kind" or key in cls.KEYS:
                continue
            problems: list[str] = []
            launchers.parse({"kind": kind, key: "x"}, str(ROOT), problems)
            said = [p for p in problems if p.startswith(f"[launcher] {key} ")]
            assert len(said) == 1, (kind, key, problems)
            assert f'kind = "{kind}"' in said[0] or f'kind is "{kind}"' in said[0], said[0]


def test_an_unknown_kind_and_an_unknown_key_are_named():
    problems: list[str] = []
    launchers.parse({"kind": "hydra", "np": 3}, str(ROOT), problems)
    assert problems[0].startswith('[launcher] kind = \'hydra\' is not allowed; allowed: "mpirun", "local"')
    assert problems[1].startswith("unknown key [launcher] np; allowed: kind, mpirun, args")


def test_nodes_and_hosts_per_kind():
    point = {"model": "vgg16", "ranks": 8, "ranks_per_host": 2, "hosts": 4, "point_id": "x", "repeat": 0}
    assert launchers.make("mpirun", hosts=[("a", 4), ("b", 4)]).nodes(point) == 2
    assert launchers.make("srun", tasks_per_node=3).nodes(point) == 3
    assert launchers.make("cluster").nodes(point) == 4
    assert launchers.make("sim").nodes(point) == 4
    assert launchers.make("local").nodes(point) == 1
