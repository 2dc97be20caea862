"""The job config: what one training job runs, as frozen dataclasses read from JSON.

A job is ``method`` (``comera`` | ``dense`` | ``galore``) applied to a ``model`` (an
architecture of :mod:`engine.models.registry` and its config) on ``data``
(:class:`engine.data.DataConfig`), with ``compression`` settings, a ``schedule`` of stages,
``training`` settings, ``checkpoint`` policy and ``galore`` settings for that baseline.

Stages run in order. Each has a kind and a length (``epochs`` or ``steps``, not both):

* ``early``: task loss + gamma * R (linear scalarization). ``gamma: "auto"`` sets the weight
  from the gradients (:mod:`engine.rank.auto_gamma`) and, with a ``target_ratio``, paces the
  size towards ``target_ratio`` x S at the stage start. For ``dense`` and ``galore`` jobs an
  ``early`` stage is plain training on the task loss.
* ``late``: the achievement scalarization with reference point (L*, S*):
  S* = ``target_ratio`` x S at the stage start; L* = ``loss_ref`` or, when unset, the
  validation loss at the stage start. The size bound falls from S to S* over the stage and
  gate entries are cut to it gradually, cheapest loss per parameter first, under the fidelity
  guard ``compression.max_metric_drop`` (:mod:`engine.train.rank_control`). ``comera`` only.
  ``steps: "auto"`` (late stages) paces the cuts by the measured recovery instead: each cut
  comes once the last one has been judged within tolerance, and the stage ends when ``S*``
  is reached by an accepted cut, or at ``max_steps`` (docs/method.md#recovery-paced-stages).
* ``finetune``: task loss only, gates frozen, so S cannot grow back (the fine-tune after
  pruning). Allowed for every method.

Late stages, and finetune stages after one, add ``teacher_weight`` x the distillation loss
from the model at the start of the last late stage (``teacher_temperature``;
:mod:`engine.train.teacher`).

Every field states its bounds (:func:`engine.configs.spec`); they are the service's wire
bounds as well (a test checks that the two agree). Every validation error names the field it
is about as a JSON path (``schedule[1].kind``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from engine.configs import ConfigError, ConfigMethods, parse, spec, to_dict, validate
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
MAX_STEPS = 1_000_000
MAX_EPOCHS = 1_000
MAX_GAMMA = 1000.0
DEFAULT_AUTO_MAX_STEPS = 2_000  # the bound of a ``steps: "auto"`` stage that gives none
DEFAULT_GAMMA = 0.01  # a stage's gamma when none is given and it is not chosen automatically
MAX_TEACHER_WEIGHT = 1000.0
MAX_TEMPERATURE = 100.0
MAX_LINEAR_D = 6  # modes per side, as compression.d
MAX_DEVICES = 64  # processes per node
MAX_NODES = 256


def as_config_error(err: Exception, default: str) -> ConfigError:
    """A ``ConfigError`` as it is (its field already names the path); any other error is
    about ``default`` as a whole."""
    if isinstance(err, ConfigError):
        return err
    return ConfigError(default, str(err))


# -- sections -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LearningRates(ConfigMethods):
    """Learning rates per parameter group (defaults: docs/method.md#training-defaults)."""

    cores: float = spec(1e-4, ge=0, le=10)
    gates: float = spec(1e-3, ge=0, le=10)
    others: float = spec(5e-5, ge=0, le=10)


@dataclass(frozen=True)
class StageConfig(ConfigMethods):
    kind: str = spec(choices=STAGE_KINDS)
    epochs: int | None = spec(None, ge=1, le=MAX_EPOCHS)
    # "auto" (late stages): as many steps as the recovery-paced cuts take, at most max_steps
    steps: int | str | None = spec(None, ge=1, le=MAX_STEPS, choices=("auto",))
    max_steps: int | None = spec(None, ge=1, le=MAX_STEPS)  # steps "auto": the bound
    lr: LearningRates = spec(factory=LearningRates)
    lr_schedule: str = spec("constant", choices=LR_SCHEDULES)
    warmup_steps: int = spec(0, ge=0, le=MAX_STEPS)
    # "auto": early stages. None (not given): "auto" for an early stage with a target_ratio
    # (a fixed gamma cannot steer the size), else 0.01, the released code's constant
    gamma: float | str | None = spec(None, ge=0, le=MAX_GAMMA, choices=("auto",))
    target_ratio: float | None = spec(None, gt=0, lt=1)
    loss_ref: float | None = spec(None, gt=0, le=1e6)
    loss_weight: float = spec(0.1, ge=0, le=1000)
    eval_every: int | None = spec(None, ge=1, le=MAX_STEPS)  # steps; None: only at the end
    name: str | None = spec(None, length=(1, 128))
    # late and finetune stages: distillation from the model at the start of the last late
    # stage (engine.train.teacher); None: the default, 0 (off: opt in with a weight > 0)
    teacher_weight: float | None = spec(None, ge=0, le=MAX_TEACHER_WEIGHT)
    teacher_temperature: float = spec(2.0, gt=0, le=MAX_TEMPERATURE)
    # late stages: at the stage start, every TT linear of fewer modes per side is rewritten
    # exactly in this many (engine.rank.refactor), so the stage can cut more bonds than the
    # one of a two-core layer; 1 keeps the form. None: 2 where the engine chose two cores
    # (max_rank "auto" without d), else 1 (engine.train.refactor_stage.stage_linear_d)
    linear_d: int | None = spec(None, ge=1, le=MAX_LINEAR_D)

    def __post_init__(self) -> None:
        if self.gamma is None:
            auto = self.kind == "early" and self.target_ratio is not None
            object.__setattr__(self, "gamma", "auto" if auto else DEFAULT_GAMMA)
        if self.steps == "auto" and self.max_steps is None:
            object.__setattr__(self, "max_steps", DEFAULT_AUTO_MAX_STEPS)
        validate(self)
        kind = self.kind
        if (self.epochs is None) == (self.steps is None):
            raise ConfigError("", "give exactly one of 'epochs' or 'steps'")
        if self.steps == "auto" and kind != "late":
            raise ConfigError("steps", f"'auto' is for 'late' stages, not {kind!r}")
        if self.max_steps is not None and self.steps != "auto":
            raise ConfigError("max_steps", "only applies to a stage with steps 'auto'")
        if self.gamma == "auto" and kind != "early":
            raise ConfigError("gamma", f"'auto' is for 'early' stages, not {kind!r}")
        if kind == "late" and self.target_ratio is None:
            raise ConfigError("target_ratio", "is required for a 'late' stage")
        if kind == "early" and self.target_ratio is not None and self.gamma != "auto":
            raise ConfigError(
                "target_ratio",
                "an 'early' stage reaches a size target only with gamma 'auto' "
                "(a fixed gamma does not steer the size)",
            )
        if kind == "finetune" and self.target_ratio is not None:
            raise ConfigError("target_ratio", "only applies to 'late' and 'early' stages")
        if kind != "late" and self.loss_ref is not None:
            raise ConfigError("loss_ref", f"only applies to 'late' stages, not {kind!r}")
        if kind != "late" and self.linear_d is not None:
            raise ConfigError("linear_d", f"only applies to 'late' stages, not {kind!r}")
        if kind == "early" and self.teacher_weight:
            raise ConfigError(
                "teacher_weight",
                "only applies to 'late' and 'finetune' stages (the teacher is the model at "
                "the start of the last late stage)",
            )

    @classmethod
    def from_dict(cls, data: object, path: str) -> StageConfig:
        if isinstance(data, Mapping) and "kind" not in data:
            raise ConfigError(f"{path}.kind", f"is required (one of {list(STAGE_KINDS)})")
        return parse(cls, data, path)

    @property
    def label(self) -> str:
        return self.name or self.kind

    @property
    def auto_steps(self) -> bool:
        """Whether the stage's length is paced by its cuts (``steps: "auto"``)."""
        return self.steps == "auto"

    @property
    def step_limit(self) -> int | None:
        """The most steps the stage runs: ``steps``, ``max_steps`` when ``steps`` is
        ``"auto"``, None for a stage given in epochs."""
        return self.max_steps if self.steps == "auto" else self.steps  # type: ignore[return-value]

    def length(self, per_epoch: int | None) -> int | None:
        """The most steps the stage runs with ``per_epoch`` batches an epoch: its
        :attr:`step_limit`, or its epochs' batches (None: an epoch's length is unknown)."""
        if self.step_limit is not None:
            return self.step_limit
        return None if per_epoch is None else per_epoch * (self.epochs or 0)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


_OWN_COMPRESSION = ("penalty", "shrink_every", "max_metric_drop", "min_rank_fraction")


@dataclass(frozen=True)
class CompressionConfig:
    """Tensorization (the fields of :class:`TensorizeOptions`, flat in JSON) plus the rank
    penalty variant, the shrink period and the late stage's guard and floors."""

    options: TensorizeOptions = spec(factory=TensorizeOptions)
    penalty: str = spec("cost_weighted", choices=PENALTIES)
    shrink_every: int = spec(50, ge=0, le=MAX_STEPS)  # steps between shrinks; 0: never
    # late stages: the validation metric may end at most this many points (accuracy 0.01 = 1
    # point) below its value at the stage start; None: no guard
    max_metric_drop: float | None = spec(1.0, ge=0, le=100)
    # late stages: no bond is cut below this share of its rank at the stage start while
    # others still have slack
    min_rank_fraction: float = spec(0.25, ge=0, le=1)

    def __post_init__(self) -> None:
        validate(self)

    @classmethod
    def from_dict(cls, data: object, path: str) -> CompressionConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(path, f"must be an object, got {type(data).__name__}")
        own = {k: v for k, v in data.items() if k in _OWN_COMPRESSION}
        rest = {k: v for k, v in data.items() if k not in _OWN_COMPRESSION}
        known = {f.name for f in fields(TensorizeOptions)}
        unknown = sorted(set(rest) - known)
        if unknown:
            raise ConfigError(
                f"{path}.{unknown[0]}",
                f"unknown field (known: {sorted(known | set(_OWN_COMPRESSION))})",
            )
        options = parse(TensorizeOptions, rest, path)
        return parse(cls, own, path).replace_options(options)

    def replace_options(self, options: TensorizeOptions) -> CompressionConfig:
        return CompressionConfig(options, **{k: getattr(self, k) for k in _OWN_COMPRESSION})

    def to_dict(self) -> dict[str, Any]:
        return {**self.options.to_dict(), **{k: getattr(self, k) for k in _OWN_COMPRESSION}}


# pretrained workloads start from the original's TT-SVD at ranks their model config decides
# (hf_bert's rank_allocation); "auto" is for models trained from scratch
NO_AUTO_RANK_ARCHS = ("hf", "hf_bert")


def default_compression(
    compression: CompressionConfig,
    given: Mapping[str, Any],
    stages: Sequence[Mapping[str, Any]],
    *,
    arch: str,
    method: str,
) -> CompressionConfig:
    """``compression`` with ``max_rank: "auto"`` when the job leaves the ranks to the engine: a
    CoMERA job of a from-scratch architecture with a ``target_ratio`` on some stage and
    neither ``compression.max_rank`` (``given``) nor any stage's ``gamma`` (``stages``: the
    stages as given). ``"auto"`` asked for on a pretrained architecture is refused."""
    options = compression.options
    if options.max_rank == "auto" and arch in NO_AUTO_RANK_ARCHS:
        raise ConfigError(
            "compression.max_rank",
            f"'auto' chooses ranks for models trained from scratch; the {arch!r} workload "
            "starts from its original's TT-SVD (give a number)",
        )
    leaves = (
        method == "comera"
        and arch not in NO_AUTO_RANK_ARCHS
        and "max_rank" not in given
        and not any(isinstance(s, Mapping) and "gamma" in s for s in stages)
        and any(isinstance(s, Mapping) and s.get("target_ratio") is not None for s in stages)
    )
    if not leaves:
        return compression
    return compression.replace_options(options.replace(max_rank="auto"))


@dataclass(frozen=True)
class TrainingConfig(ConfigMethods):
    """Per-step settings. ``fast_path``: group merges and sibling products around each forward
    (:mod:`engine.train.fast_path`; same results to float rounding). ``precision``: ``bf16``
    runs activations under ``torch.autocast`` in bfloat16 with float32 master weights
    (:mod:`engine.train.precision`). ``cuda_graph``: capture and replay the whole step on CUDA
    (:mod:`engine.train.cuda_graphs`); ``auto`` does when it can, ``on`` requires it.
    ``devices`` / ``nodes``: data-parallel processes per node and machines
    (:mod:`engine.train.distributed`); ``batch_size`` is the global batch."""

    batch_size: int = spec(32, ge=1, le=4096)
    seed: int = spec(0, ge=0, le=2**31 - 1)
    device: str = "cpu"
    grad_clip: float | None = spec(None, gt=0, le=1e6)
    weight_decay: float = spec(0.0, ge=0, le=1)
    log_every: int = spec(10, ge=1, le=100_000)
    eval_batches: int | None = spec(None, ge=1, le=100_000)  # validation batches per evaluation
    fast_path: bool = True
    precision: str = spec("fp32", choices=PRECISIONS)
    cuda_graph: str = spec("auto", choices=CUDA_GRAPH_MODES)
    devices: int = spec(1, ge=1, le=MAX_DEVICES)
    nodes: int = spec(1, ge=1, le=MAX_NODES)

    def __post_init__(self) -> None:
        validate(self)
        dev = self.device
        if not (dev == "cpu" or (dev.startswith("cuda") and re.fullmatch(r"cuda(:\d+)?", dev))):
            raise ConfigError("device", f"must be 'cpu' or 'cuda[:N]', got {dev!r}")
        if self.precision == "bf16" and not self.fast_path:
            raise ConfigError(
                "precision",
                "bf16 runs TT layers through the fast path: set training.fast_path to true",
            )
        world = self.devices * self.nodes
        if self.cuda_graph == "on" and world > 1:
            raise ConfigError(
                "cuda_graph",
                "'on' needs one process: graphs are not captured again after the data-parallel "
                "wrapper is rebuilt (use 'auto' or 'off')",
            )
        if self.batch_size % world:
            raise ConfigError(
                "batch_size",
                f"the global batch {self.batch_size} must divide among {world} processes "
                "(devices x nodes)",
            )
        if self.cuda_graph == "on" and not self.device.startswith("cuda"):
            raise ConfigError(
                "cuda_graph",
                f"'on' needs a CUDA device, got device {self.device!r} (use 'auto' or 'off')",
            )


@dataclass(frozen=True)
class CheckpointConfig(ConfigMethods):
    every_steps: int | None = spec(None, ge=1, le=MAX_STEPS)  # None: the end and stops only
    keep: int = spec(2, ge=1, le=20)

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class GaloreConfig(ConfigMethods):
    """GaLore baseline (galore-torch ``GaLoreAdamW``) on the 2-D weights of selected layers."""

    rank: int = spec(128, ge=1, le=4096)
    update_proj_gap: int = spec(200, ge=1, le=MAX_STEPS)
    scale: float = spec(0.25, gt=0, le=100)
    proj_type: str = spec("std", choices=("std", "reverse_std", "left", "right"))

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    config: Mapping[str, Any] = spec(factory=dict)

    @classmethod
    def from_dict(cls, data: object, path: str) -> ModelConfig:
        if isinstance(data, Mapping) and "arch" not in data:
            raise ConfigError(f"{path}.arch", "is required")
        out = parse(cls, data, path)
        try:
            get_workload(out.arch)
        except ValueError:
            from engine.models.registry import WORKLOADS

            raise ConfigError(
                f"{path}.arch",
                f"unknown architecture {out.arch!r}; choose one of {sorted(WORKLOADS)}",
            ) from None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"arch": self.arch, "config": dict(self.config)}
