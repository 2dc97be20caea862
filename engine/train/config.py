"""The job config: what one training job runs, as frozen dataclasses read from JSON.

A job is ``method`` (``comera`` | ``dense`` | ``galore``) applied to a ``model`` (an
architecture of :mod:`engine.models.registry` and its config) on ``data``
(:class:`engine.data.DataConfig`), with ``compression`` settings, a ``schedule`` of stages,
``training`` settings, ``checkpoint`` policy and ``galore`` settings for that baseline.

Stages run in order. Each has a kind and a length (``epochs`` or ``steps``, not both):

* ``early``: task loss + gamma * R (linear scalarization, method doc §4.2). For ``dense`` and
  ``galore`` jobs an ``early`` stage is plain training on the task loss.
* ``late``: the achievement scalarization of §4.3 with reference point (L*, S*):
  S* = ``target_ratio`` x S at the stage start; L* = ``loss_ref`` or, when unset, the
  validation loss at the stage start (Part B item 4). When the stage ends with S > S*, the
  least important gate entries are pruned until S <= S* (Part B item 5). ``comera`` only.
* ``finetune``: task loss only, gates frozen, so S cannot grow back (the fine-tune after
  pruning). Allowed for every method.

Every validation error names the field it is about, as a JSON path (``schedule[1].kind``).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from engine.models.registry import TensorizeOptions, get_workload
from engine.rank.penalty import PENALTIES

__all__ = [
    "METHODS",
    "STAGE_KINDS",
    "PRECISIONS",
    "CUDA_GRAPH_MODES",
    "ConfigError",
    "as_config_error",
    "LearningRates",
    "StageConfig",
    "CompressionConfig",
    "TrainingConfig",
    "CheckpointConfig",
    "GaloreConfig",
    "ModelConfig",
]

CONFIG_VERSION = 1
METHODS = ("comera", "dense", "galore")
STAGE_KINDS = ("early", "late", "finetune")
LR_SCHEDULES = ("constant", "cosine")
PRECISIONS = ("fp32", "bf16")
CUDA_GRAPH_MODES = ("auto", "on", "off")
MAX_STEPS = 10_000_000
MAX_EPOCHS = 100_000


class ConfigError(ValueError):
    """A bad job config; ``field`` is the JSON path of the offending value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def as_config_error(err: Exception, default: str) -> ConfigError:
    """A ``ValueError`` whose message starts with a field path (``data.max_len must ...``)
    becomes a :class:`ConfigError` for that path; other messages are filed under ``default``."""
    if isinstance(err, ConfigError):
        return err
    msg = str(err)
    head = msg.split(" ", 1)[0].rstrip(":")
    root = default.split(".", 1)[0]
    if head.startswith(root) and re.fullmatch(r"[\w.\[\]]+", head):
        return ConfigError(head, msg[len(head):].lstrip(":").strip())
    return ConfigError(default, msg)


# -- small validators -----------------------------------------------------------------------
def _int(value: object, path: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (
        high is not None and value > high
    ):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(path, f"must be an integer {bound}, got {value!r}")
    return int(value)


def _float(value: object, path: str, low: float = 0.0, high: float = math.inf,
           *, open_low: bool = False) -> float:
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
          and math.isfinite(value) and (value > low if open_low else value >= low)
          and value <= high)  # fmt: skip
    if not ok:
        side = ">" if open_low else ">="
        raise ConfigError(path, f"must be a finite number {side} {low} and <= {high}, "
                                f"got {value!r}")
    return float(value)


def _choice(value: object, path: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(path, f"must be one of {list(choices)}, got {value!r}")
    return str(value)


def _mapping(data: object, path: str, cls: type) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"must be an object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}" if path else unknown[0],
                          f"unknown field (known: {sorted(names)})")
    return dict(data)


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _to_dict(obj: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}


# -- sections -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LearningRates:
    """Learning rates per parameter group (Part B item 10 defaults)."""

    cores: float = 1e-4
    gates: float = 1e-3
    others: float = 5e-5

    @classmethod
    def from_dict(cls, data: object, path: str) -> LearningRates:
        d = _mapping(data, path, cls)
        return cls(**{k: _float(v, f"{path}.{k}", high=10.0) for k, v in d.items()})

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


@dataclass(frozen=True)
class StageConfig:
    kind: str
    epochs: int | None = None
    steps: int | None = None
    lr: LearningRates = field(default_factory=LearningRates)
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    gamma: float = 0.01
    target_ratio: float | None = None
    loss_ref: float | None = None
    loss_weight: float = 0.1
    eval_every: int | None = None  # steps; None: only at the end of the stage
    name: str | None = None

    @classmethod
    def from_dict(cls, data: object, path: str) -> StageConfig:
        d = _mapping(data, path, cls)
        if "kind" not in d:
            raise ConfigError(f"{path}.kind", f"is required (one of {list(STAGE_KINDS)})")
        kind = _choice(d["kind"], f"{path}.kind", STAGE_KINDS)
        out: dict[str, Any] = {"kind": kind}
        has_epochs, has_steps = d.get("epochs") is not None, d.get("steps") is not None
        if has_epochs == has_steps:
            raise ConfigError(path, "give exactly one of 'epochs' or 'steps'")
        if has_epochs:
            out["epochs"] = _int(d["epochs"], f"{path}.epochs", 1, MAX_EPOCHS)
        if has_steps:
            out["steps"] = _int(d["steps"], f"{path}.steps", 1, MAX_STEPS)
        if "lr" in d:
            out["lr"] = LearningRates.from_dict(d["lr"], f"{path}.lr")
        if "lr_schedule" in d:
            out["lr_schedule"] = _choice(d["lr_schedule"], f"{path}.lr_schedule", LR_SCHEDULES)
        if "warmup_steps" in d:
            out["warmup_steps"] = _int(d["warmup_steps"], f"{path}.warmup_steps", 0, MAX_STEPS)
        if "gamma" in d:
            out["gamma"] = _float(d["gamma"], f"{path}.gamma", high=1e6)
        if "loss_weight" in d:
            out["loss_weight"] = _float(d["loss_weight"], f"{path}.loss_weight", high=1e6)
        if d.get("target_ratio") is not None:
            out["target_ratio"] = _float(d["target_ratio"], f"{path}.target_ratio", 0.0, 1.0,
                                         open_low=True)
        if d.get("loss_ref") is not None:
            out["loss_ref"] = _float(d["loss_ref"], f"{path}.loss_ref", 0.0, 1e6, open_low=True)
        if d.get("eval_every") is not None:
            out["eval_every"] = _int(d["eval_every"], f"{path}.eval_every", 1, MAX_STEPS)
        if d.get("name") is not None:
            if not isinstance(d["name"], str) or not 0 < len(d["name"]) <= 64:
                raise ConfigError(f"{path}.name", "must be a string of 1-64 characters")
            out["name"] = d["name"]
        if kind == "late" and "target_ratio" not in out:
            raise ConfigError(f"{path}.target_ratio", "is required for a 'late' stage")
        if kind != "late":
            for key in ("target_ratio", "loss_ref"):
                if key in out:
                    raise ConfigError(f"{path}.{key}", f"only applies to 'late' stages, "
                                                       f"not {kind!r}")
        return cls(**out)

    @property
    def label(self) -> str:
        return self.name or self.kind

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


@dataclass(frozen=True)
class CompressionConfig:
    """Tensorization (see :class:`TensorizeOptions`) plus the rank penalty variant."""

    options: TensorizeOptions = field(default_factory=TensorizeOptions)
    penalty: str = "cost_weighted"
    shrink_every: int = 50  # steps between physical shrinks; 0: never during training

    @classmethod
    def from_dict(cls, data: object, path: str) -> CompressionConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(path, f"must be an object, got {type(data).__name__}")
        d = dict(data)
        penalty = _choice(d.pop("penalty", "cost_weighted"), f"{path}.penalty", PENALTIES)
        shrink = _int(d.pop("shrink_every", 50), f"{path}.shrink_every", 0, MAX_STEPS)
        if "max_rank" in d:
            _int(d["max_rank"], f"{path}.max_rank", 1, 1024)
        if d.get("embedding_max_rank") is not None:
            _int(d["embedding_max_rank"], f"{path}.embedding_max_rank", 1, 1024)
        known = {f.name for f in fields(TensorizeOptions)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{path}.{unknown[0]}", f"unknown field (known: "
                              f"{sorted(known | {'penalty', 'shrink_every'})})")
        try:
            options = TensorizeOptions.from_dict(d)
        except ValueError as err:  # TensorizeOptions names its own field first
            name = str(err).split(" ", 1)[0]
            raise ConfigError(f"{path}.{name}", str(err)) from None
        return cls(options=options, penalty=penalty, shrink_every=shrink)

    def to_dict(self) -> dict[str, Any]:
        return {**self.options.to_dict(), "penalty": self.penalty,
                "shrink_every": self.shrink_every}


@dataclass(frozen=True)
class TrainingConfig:
    """Per-step settings. ``fast_path``: group merges and sibling products around each forward
    (:mod:`engine.train.fast_path`; same results to float rounding). ``precision``: ``bf16``
    runs activations under ``torch.autocast`` in bfloat16 with float32 master weights
    (:mod:`engine.train.precision`). ``cuda_graph``: capture and replay the whole step on CUDA
    (:mod:`engine.train.cuda_graphs`); ``auto`` does when it can, ``on`` requires it."""

    batch_size: int = 32
    seed: int = 0
    device: str = "cpu"
    grad_clip: float | None = None
    weight_decay: float = 0.0
    log_every: int = 10
    eval_batches: int | None = None  # cap on validation batches per evaluation
    fast_path: bool = True
    precision: str = "fp32"
    cuda_graph: str = "auto"

    def __post_init__(self) -> None:
        _choice(self.precision, "training.precision", PRECISIONS)
        _choice(self.cuda_graph, "training.cuda_graph", CUDA_GRAPH_MODES)
        if not isinstance(self.fast_path, bool):
            raise ConfigError("training.fast_path", f"must be a boolean, got {self.fast_path!r}")
        if self.precision == "bf16" and not self.fast_path:
            raise ConfigError("training.precision", "bf16 runs TT layers through the fast path: "
                              "set training.fast_path to true")
        if self.cuda_graph == "on" and not self.device.startswith("cuda"):
            raise ConfigError("training.cuda_graph", f"'on' needs a CUDA device, got device "
                              f"{self.device!r} (use 'auto' or 'off')")

    @classmethod
    def from_dict(cls, data: object, path: str) -> TrainingConfig:
        d = _mapping(data, path, cls)
        out: dict[str, Any] = {}
        if "batch_size" in d:
            out["batch_size"] = _int(d["batch_size"], f"{path}.batch_size", 1, 65536)
        if "seed" in d:
            out["seed"] = _int(d["seed"], f"{path}.seed", 0, 2**63 - 1)
        if "device" in d:
            dev = d["device"]
            if not isinstance(dev, str) or not (dev == "cpu" or dev.startswith("cuda")):
                raise ConfigError(f"{path}.device", f"must be 'cpu' or 'cuda[:N]', got {dev!r}")
            out["device"] = dev
        if d.get("grad_clip") is not None:
            out["grad_clip"] = _float(d["grad_clip"], f"{path}.grad_clip", 0.0, 1e6,
                                      open_low=True)
        if "weight_decay" in d:
            out["weight_decay"] = _float(d["weight_decay"], f"{path}.weight_decay", high=1.0)
        if "log_every" in d:
            out["log_every"] = _int(d["log_every"], f"{path}.log_every", 1, MAX_STEPS)
        if d.get("eval_batches") is not None:
            out["eval_batches"] = _int(d["eval_batches"], f"{path}.eval_batches", 1, MAX_STEPS)
        if "fast_path" in d:
            if not isinstance(d["fast_path"], bool):
                raise ConfigError(f"{path}.fast_path", f"must be a boolean, got "
                                                      f"{d['fast_path']!r}")
            out["fast_path"] = d["fast_path"]
        if "precision" in d:
            out["precision"] = _choice(d["precision"], f"{path}.precision", PRECISIONS)
        if "cuda_graph" in d:
            out["cuda_graph"] = _choice(d["cuda_graph"], f"{path}.cuda_graph", CUDA_GRAPH_MODES)
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int | None = None  # None: only at the end and on cancellation
    keep: int = 2

    @classmethod
    def from_dict(cls, data: object, path: str) -> CheckpointConfig:
        d = _mapping(data, path, cls)
        out: dict[str, Any] = {}
        if d.get("every_steps") is not None:
            out["every_steps"] = _int(d["every_steps"], f"{path}.every_steps", 1, MAX_STEPS)
        if "keep" in d:
            out["keep"] = _int(d["keep"], f"{path}.keep", 1, 100)
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


@dataclass(frozen=True)
class GaloreConfig:
    """GaLore baseline (galore-torch ``GaLoreAdamW``) on the 2-D weights of selected layers."""

    rank: int = 128
    update_proj_gap: int = 200
    scale: float = 0.25
    proj_type: str = "std"

    @classmethod
    def from_dict(cls, data: object, path: str) -> GaloreConfig:
        d = _mapping(data, path, cls)
        out: dict[str, Any] = {}
        if "rank" in d:
            out["rank"] = _int(d["rank"], f"{path}.rank", 1, 4096)
        if "update_proj_gap" in d:
            out["update_proj_gap"] = _int(d["update_proj_gap"], f"{path}.update_proj_gap", 1,
                                          MAX_STEPS)
        if "scale" in d:
            out["scale"] = _float(d["scale"], f"{path}.scale", 0.0, 100.0, open_low=True)
        if "proj_type" in d:
            out["proj_type"] = _choice(d["proj_type"], f"{path}.proj_type",
                                       ("std", "reverse_std", "left", "right"))
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: object, path: str) -> ModelConfig:
        d = _mapping(data, path, cls)
        if "arch" not in d:
            raise ConfigError(f"{path}.arch", "is required")
        try:
            get_workload(d["arch"])
        except ValueError:
            from engine.models.registry import WORKLOADS

            raise ConfigError(f"{path}.arch", f"unknown architecture {d['arch']!r}; choose "
                                              f"one of {sorted(WORKLOADS)}") from None
        cfg = d.get("config", {})
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{path}.config", "must be an object")
        return cls(arch=d["arch"], config=dict(cfg))

    def to_dict(self) -> dict[str, Any]:
        return {"arch": self.arch, "config": dict(self.config)}
