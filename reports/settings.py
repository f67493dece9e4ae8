"""The settings a sweep point may fix: their types, allowed values and kolo-train flags.

One table serves the sweep-file validator, the command-line builder and the CSV schema, so a
setting is named the same everywhere: in a sweep file, in kolo-train's JSON record ("settings")
and as a CSV column.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

# Models kolo-train knows (models/zoo); the names are its --model values.
MODELS = (
    "inception3",
    "inception3-noaux",
    "resnet50",
    "resnet101",
    "resnet152",
    "vgg16",
    "tiny-mlp",
    "tiny-cnn",
    "tiny-resnet",
    "tiny-inception",
)
COMPUTES = ("onednn", "cudnn", "replay")
# "none": one rank that trains without any distributed communication, the single-GPU baseline
# scaling efficiency is measured against.
BASELINE_BACKEND = "none"
BACKENDS = ("ring", "mpi", "ps", "nccl", BASELINE_BACKEND)
# What fixes a single rank's compute: points (and CSV rows) equal in these share one baseline.
# Micro-batches per step count: local aggregation changes how often the optimizer runs per image.
# So does time dilation: a dilated run is measured against a baseline dilated alike.
BASELINE_SETTINGS = (
    "model",
    "batch_size",
    "compute",
    "profile",
    "gpu_rate",
    "dilation",
    "precision",
    "backward_passes_per_step",
    "image_size",
    "num_classes",
)
# The settings of the emulated network ([launcher] kind = "cluster", scripts/cluster): the
# launcher consumes them, kolo-train never sees them. "hosts" is the training workers' hosts
# (ranks = hosts x ranks_per_host); its CSV column is "nodes", the hosts the job spanned.
CLUSTER_SETTINGS = ("hosts", "ranks_per_host", "link", "delay_us", "flow_cap")
# The settings of a prediction ([launcher] kind = "sim", kolo-sim): what it predicts with besides
# the profile. A simulated network also takes ranks_per_host and link (hosts = ranks /
# ranks_per_host, up to any size), and dilation for predicting an emulated cluster's points.
SIM_SETTINGS = ("calibration", "gpu_rate", "step_jitter", "allreduce", "framework")
# Of those, the ones a measured run refuses: `allreduce` is both kolo-sim's ring layout and, for a
# measured run, kolo-train's --hierarchical-allreduce.
SIM_ONLY_SETTINGS = tuple(s for s in SIM_SETTINGS if s != "allreduce")
SIM_NETWORK_SETTINGS = ("ranks_per_host", "link")
# A link rate as scripts/cluster takes it: a number and kbit, mbit or gbit (per second), from
# 1mbit to 100gbit.
RATE_UNITS = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
RATE_RANGE = (1e6, 100e9)
_RATE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(kbit|mbit|gbit)$")
# A parameter server's push pacing: a rate as a link's (no range of tc's), or off.
_PACING_RE = re.compile(r"^(off|[0-9]+(?:\.[0-9]+)?(kbit|mbit|gbit))$")
TRANSPORTS = ("auto", "shm", "tcp", "rdma")
# The ring backend's allreduce algorithms (Options::allreduce_algorithm, engine/common/options.cc).
ALLREDUCE_ALGORITHMS = ("auto", "ring", "recursive-doubling", "halving-doubling", "one-shot")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
# TCP connections per pair of ranks (Options::tcp_streams): auto, or 1 to 16.
_TCP_STREAMS_RE = re.compile(r"^(auto|[1-9]|1[0-6])$")
# Gradient compression (Options::compression): float32 gradients travel in half precision.
COMPRESSIONS = ("none", "fp16", "bf16")
PS_PLACEMENTS = ("greedy", "split")
# Which hosts a point's parameter servers run on, under mpirun across hosts (reports/placement.py).
PS_HOSTS = ("spread", "dedicated")

# The parameter server's own settings: pairing a ring point with ps points sets them aside.
PS_ONLY = ("ps_servers", "ps_placement", "ps_pacing")

# Backends whose traffic goes over kolo's own transports (auto, shm, tcp or rdma).
TRANSPORT_BACKENDS = ("ring", "ps")


@dataclass(frozen=True)
class Setting:
    """One knob of a sweep point.

    kind: "int", "float" or "str". choices: the allowed strings (str settings with a closed set).
    minimum / exclusive_minimum: the allowed range of a number. flag: kolo-train's option, or None
    for settings the launcher consumes (ranks). applies: whether the setting means anything for a
    point; a setting that does not apply is left out of the point (and of its id), so that for
    example ps_servers does not multiply ring points.
    """

    name: str
    kind: str
    flag: str | None
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None
    applies: Callable[[dict], bool] | None = None
    help: str = ""
    # str settings with a format: a full-match regular expression and its description in words.
    pattern: re.Pattern | None = None
    pattern_words: str = ""
    # The CSV column holding the setting, when it is not the setting's own name.
    column: str | None = None

    @property
    def csv_column(self) -> str:
        return self.column or self.name

    def allowed(self) -> str:
        """Says in words what values are allowed."""
        if self.choices:
            return "one of " + ", ".join(f'"{c}"' for c in self.choices)
        if self.pattern_words:
            return self.pattern_words
        noun = {"int": "an integer", "float": "a number", "str": "a string"}[self.kind]
        parts = []
        if self.minimum is not None:
            op = ">" if self.exclusive_minimum else ">="
            parts.append(f"{op} {_fmt(self.minimum)}")
        if self.maximum is not None:
            parts.append(f"<= {_fmt(self.maximum)}")
        return noun + (" " + " and ".join(parts) if parts else "")

    def check(self, value: object) -> str | None:
        """Returns None when `value` is allowed, else why not (naming what is allowed)."""
        if self.kind == "int":
            ok_type = isinstance(value, int) and not isinstance(value, bool)
        elif self.kind == "float":
            ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok_type = isinstance(value, str)
        if not ok_type:
            return f"{value!r} is a {_toml_type(value)}; allowed: {self.allowed()}"
        if self.choices and value not in self.choices:
            return f"{value!r} is not allowed; allowed: {self.allowed()}"
        if self.kind == "str" and not self.choices and not value:
            return "an empty string is not allowed; allowed: a non-empty string"
        if self.pattern is not None and not self.pattern.match(value):
            return f"{value!r} is not allowed; allowed: {self.allowed()}"
        if self.name == "link" and not RATE_RANGE[0] <= rate_bits(value) <= RATE_RANGE[1]:
            return f"{value!r} is out of range; allowed: {self.allowed()}"
        if self.minimum is not None:
            low = value <= self.minimum if self.exclusive_minimum else value < self.minimum
            if low:
                return f"{value!r} is out of range; allowed: {self.allowed()}"
        if self.maximum is not None and value > self.maximum:
            return f"{value!r} is out of range; allowed: {self.allowed()}"
        return None


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__


def _uses_transport(point: dict) -> bool:
    return point.get("backend", "ring") in TRANSPORT_BACKENDS


def _is_ring(point: dict) -> bool:
    return point.get("backend", "ring") == "ring"


def _communicates(point: dict) -> bool:
    return point.get("backend", "ring") != BASELINE_BACKEND


def _is_ps(point: dict) -> bool:
    return point.get("backend") == "ps"


def _is_replay(point: dict) -> bool:
    return point.get("compute") == "replay"


SETTINGS: tuple[Setting, ...] = (
    Setting("model", "str", "--model", choices=MODELS, help="network to train"),
    Setting("ranks", "int", None, minimum=1, maximum=65536, help="training workers"),
    Setting("batch_size", "int", "--batch-size", minimum=1, maximum=65536, help="per rank"),
    Setting("num_warmup_batches", "int", "--num-warmup-batches", minimum=0),
    Setting("num_batches", "int", "--num-batches", minimum=1),
    Setting("compute", "str", "--compute", choices=COMPUTES),
    Setting(
        "profile",
        "str",
        "--profile",
        applies=_is_replay,
        help="replay profile; {model} and {batch_size} are replaced; relative to the repository",
    ),
    Setting(
        "dilation",
        "float",
        "--dilation",
        minimum=1,
        maximum=10000,
        help="time dilation, replay only: replayed times slept K times over, results at the represented pace",
    ),
    Setting("backend", "str", "--backend", choices=BACKENDS),
    Setting("transport", "str", "--transport", choices=TRANSPORTS, applies=_uses_transport),
    Setting(
        "allreduce_algorithm",
        "str",
        "--allreduce-algorithm",
        choices=ALLREDUCE_ALGORITHMS,
        applies=_is_ring,
        help="ring backend: auto picks per collective by size (KOLO_ALLREDUCE_ALGORITHM)",
    ),
    Setting(
        "compression",
        "str",
        "--compression",
        choices=COMPRESSIONS,
        applies=_communicates,
        help="float32 gradients travel as fp16 or bf16 (allreduces, parameter-server pushes)",
    ),
    Setting(
        "tcp_streams",
        "str",
        "--tcp-streams",
        pattern=_TCP_STREAMS_RE,
        pattern_words='"auto" or a number of streams from 1 to 16',
        applies=_uses_transport,
        help="TCP connections per pair of ranks, large messages striped across them (KOLO_TCP_STREAMS)",
    ),
    Setting(
        "autotune",
        "str",
        "--autotune",
        choices=("on", "off"),
        applies=_communicates,
        help="on: search fusion threshold, cycle time and algorithm before the timed steps",
    ),
    Setting("precision", "str", "--precision", choices=PRECISIONS),
    Setting("fusion_threshold_mb", "float", "--fusion-threshold-mb", minimum=0),
    Setting("cycle_time_ms", "float", "--cycle-time-ms", minimum=0, exclusive_minimum=True),
    Setting("backward_passes_per_step", "int", "--backward-passes-per-step", minimum=1),
    Setting("image_size", "int", "--image-size", minimum=1),
    Setting("num_classes", "int", "--num-classes", minimum=1),
    Setting("ps_servers", "int", "--ps-servers", minimum=1, applies=_is_ps),
    Setting("ps_placement", "str", "--ps-placement", choices=PS_PLACEMENTS, applies=_is_ps),
    Setting(
        "ps_pacing",
        "str",
        "--ps-pacing",
        pattern=_PACING_RE,
        pattern_words='a rate like "125mbit" or "1.5gbit" (kbit, mbit or gbit), or "off"',
        applies=_is_ps,
        help="the most each worker sends per second to each server (kernel pacing); off by default",
    ),
    Setting(
        "ps_hosts",
        "str",
        None,
        choices=PS_HOSTS,
        applies=_is_ps,
        help="parameter servers one per worker host (spread) or on hosts of their own (dedicated)",
    ),
    Setting(
        "hosts",
        "int",
        None,
        minimum=1,
        maximum=16,
        column="nodes",
        help="emulated hosts of the training workers (kind = cluster)",
    ),
    Setting("ranks_per_host", "int", None, minimum=1, maximum=64, help="workers per emulated host"),
    Setting(
        "link",
        "str",
        None,
        pattern=_RATE_RE,
        pattern_words='a rate like "1gbit", "500mbit" or "2.5gbit" (kbit, mbit or gbit; 1mbit to 100gbit)',
        help="rate of each emulated host's link (tc tbf, both directions)",
    ),
    Setting("delay_us", "int", None, minimum=0, maximum=1000000, help="one-way delay added per link, µs"),
    Setting(
        "flow_cap",
        "str",
        None,
        pattern=_PACING_RE,
        pattern_words='a rate like "250mbit" (kbit, mbit or gbit), or "off"',
        help="emulated per-flow cap: each TCP connection of kolo paced at it (cluster up --flow-cap)",
    ),
    Setting(
        "calibration",
        "str",
        None,
        help="kolo-sim calibration JSON (kind = sim; relative to the repository; sim/calibrations/)",
    ),
    Setting(
        "gpu_rate",
        "float",
        None,
        minimum=0,
        exclusive_minimum=True,
        help="kind = sim: single-GPU images/sec the replay profile is scaled to",
    ),
    Setting(
        "step_jitter",
        "float",
        None,
        minimum=0,
        maximum=0.5,
        help="kind = sim: one rank's step-time coefficient of variation; the step waits for the slowest rank",
    ),
    Setting(
        "allreduce",
        "str",
        None,
        choices=("flat", "hierarchical"),
        help="ring layout: flat, or hierarchical allreduce (kolo-train --hierarchical-allreduce; kolo-sim --allreduce)",
    ),
    Setting(
        "framework",
        "str",
        None,
        choices=("kolo", "horovod-tf", "ddp"),
        help="kind = sim: when updates run: kolo (each once its collective is done), horovod-tf (all "
        "after the step's last allreduce), ddp (PyTorch DDP's 25 MiB buckets, the optimizer after)",
    ),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
NAMES: tuple[str, ...] = tuple(s.name for s in SETTINGS)


def rate_bits(rate: str) -> float:
    """Bits per second of a rate like "1gbit"; 0 when it is not one."""
    m = _RATE_RE.match(rate or "")
    return float(m.group(1)) * RATE_UNITS[m.group(2)] if m else 0.0


def format_rate(bits: float) -> str:
    """A rate in tc's words, in the largest unit that keeps it at least 1: 25e9 -> "25gbit"."""
    for unit, factor in sorted(RATE_UNITS.items(), key=lambda kv: -kv[1]):
        if bits >= factor:
            return f"{bits / factor:.6g}{unit}"
    return f"{bits:.6g}bit"


def represented_link(link: str, dilation: float) -> str:
    """The link an emulated one stands for under time dilation: its rate times the dilation
    ("1gbit" at dilation 25 -> "25gbit"); empty without a link."""
    bits = rate_bits(link)
    return format_rate(bits * dilation) if bits > 0 else ""


def normalize(point: dict) -> dict:
    """Drops the settings that do not apply to `point` and orders the rest as in SETTINGS."""
    return {
        name: point[name]
        for name in NAMES
        if name in point and (BY_NAME[name].applies is None or BY_NAME[name].applies(point))
    }


def point_id(point: dict) -> str:
    """A stable id of a point: a hash of its normalized settings and repeat index."""
    key = {k: v for k, v in point.items() if k not in ("point_id",)}
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def process_count(point: dict) -> int:
    """Processes the launcher starts: the training ranks plus, for backend ps, its servers."""
    servers = point.get("ps_servers", 1) if _is_ps(point) else 0
    return point["ranks"] + servers


def trainer_args(point: dict) -> list[str]:
    """kolo-train's command-line arguments for `point` (settings it does not set are left to
    kolo-train's defaults)."""
    args: list[str] = []
    for name, value in normalize(point).items():
        flag = BY_NAME[name].flag
        if name == "autotune":  # a flag without a value
            args += [flag] if value == "on" else []
        elif name == "allreduce":  # the ring layout: a flag without a value
            args += ["--hierarchical-allreduce"] if value == "hierarchical" else []
        elif flag is not None:
            args += [flag, _fmt(value) if isinstance(value, float) else str(value)]
    return args
