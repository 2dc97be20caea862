"""How a job trains: its stage schedule (``StageSpec`` with its ``LearningRatesSpec``), the
per-step settings (``TrainingSpec``), its limits and its checkpoints. Part of the job resource
of :mod:`api_schemas.jobs`, which re-exports it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from api_schemas.common import StrictModel

__all__ = [
    "MAX_EPOCHS",
    "MAX_STEPS",
    "CheckpointingSpec",
    "LearningRatesSpec",
    "LimitsSpec",
    "Name",
    "StageSpec",
    "TrainingSpec",
]

MAX_STEPS = 1_000_000
MAX_EPOCHS = 1_000
DEFAULT_GAMMA = 0.01  # a stage's gamma when none is given and it is not chosen automatically
DEFAULT_AUTO_MAX_STEPS = 2_000  # a steps "auto" stage's bound when it gives none
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w.\- ]*$")]


class LearningRatesSpec(StrictModel):
    cores: float = Field(default=1e-4, ge=0, le=10)
    gates: float = Field(default=1e-3, ge=0, le=10)
    others: float = Field(default=5e-5, ge=0, le=10)


class StageSpec(StrictModel):
    """One stage of the schedule; exactly one of ``epochs`` and ``steps``."""

    kind: Literal["early", "late", "finetune"]
    name: Name | None = None
    epochs: StrictInt | None = Field(default=None, ge=1, le=MAX_EPOCHS)
    # "auto" (late stages): the cuts are paced by the measured recovery and the stage ends when
    # an accepted cut reaches the target, at most max_steps (null with "auto": 2,000)
    steps: Annotated[StrictInt, Field(ge=1, le=MAX_STEPS)] | Literal["auto"] | None = None
    max_steps: StrictInt | None = Field(default=None, ge=1, le=MAX_STEPS)
    lr: LearningRatesSpec = Field(default_factory=LearningRatesSpec)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: StrictInt = Field(default=0, ge=0, le=MAX_STEPS)
    # "auto" (early stages): the weight follows the gradients (the penalty's push on the gates
    # a set share of the task's) and, with a target_ratio, the size is cut towards it.
    # null (not given): "auto" for an early stage with a target_ratio, else 0.01
    gamma: Annotated[float, Field(ge=0, le=1000)] | Literal["auto"] | None = None
    target_ratio: float | None = Field(default=None, gt=0, lt=1)
    loss_ref: float | None = Field(default=None, gt=0, le=1e6)
    loss_weight: float = Field(default=0.1, ge=0, le=1000)
    eval_every: StrictInt | None = Field(default=None, ge=1, le=MAX_STEPS)
    # late and finetune stages: weight of the distillation from the model at the start of the
    # last late stage (null: the engine's default, 0, off; opt in with a weight > 0) and its
    # temperature
    teacher_weight: float | None = Field(default=None, ge=0, le=1000)
    teacher_temperature: float = Field(default=2.0, gt=0, le=100)
    # late stages: at the stage start every TT linear of fewer modes per side is rewritten,
    # exactly, in this many, so the stage can cut more bonds; 1 keeps the form (null: 2 where
    # the engine chose two cores, max_rank "auto" without d; else 1)
    linear_d: StrictInt | None = Field(default=None, ge=1, le=6)

    @model_validator(mode="after")
    def _length(self) -> StageSpec:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of epochs and steps")
        if self.steps == "auto" and self.kind != "late":
            raise ValueError("steps 'auto' is for 'late' stages")
        if self.max_steps is not None and self.steps != "auto":
            raise ValueError("max_steps is for a stage with steps 'auto'")
        if self.steps == "auto" and self.max_steps is None:
            object.__setattr__(self, "max_steps", DEFAULT_AUTO_MAX_STEPS)
        if self.kind == "early" and self.teacher_weight:
            raise ValueError("teacher_weight is for 'late' and 'finetune' stages")
        if self.kind != "late" and self.linear_d is not None:
            raise ValueError("linear_d is for 'late' stages")
        if self.gamma is None:  # the default is filled here (fields_set still says not given)
            auto = self.kind == "early" and self.target_ratio is not None
            object.__setattr__(self, "gamma", "auto" if auto else DEFAULT_GAMMA)
        return self

    @field_validator("loss_ref")
    @classmethod
    def _late_only(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("kind") != "late":
            raise ValueError(f"{info.field_name} is only for 'late' stages")
        return v

    @field_validator("gamma")
    @classmethod
    def _auto_early(cls, v: float | str, info: ValidationInfo) -> float | str:
        if v == "auto" and info.data.get("kind") != "early":
            raise ValueError("'auto' is for 'early' stages")
        return v

    @field_validator("target_ratio")
    @classmethod
    def _target_stage(cls, v: float | None, info: ValidationInfo) -> float | None:
        kind, gamma = info.data.get("kind"), info.data.get("gamma")
        if v is not None and kind == "finetune":
            raise ValueError("target_ratio is for 'late' stages and 'early' ones with gamma 'auto'")
        if v is not None and kind == "early" and gamma not in ("auto", None):
            raise ValueError("an 'early' stage reaches a size target only with gamma 'auto'")
        return v


def _located(field: str, value: Any, message: str) -> InitErrorDetails:
    """A validation error at ``field`` of the model being validated."""
    return InitErrorDetails(
        type=PydanticCustomError("value_error", "{message}", {"message": message}),
        loc=(field,),
        input=value,
    )


class TrainingSpec(StrictModel):
    """Per-step settings (the engine's ``TrainingConfig``). ``fast_path``, ``precision`` and
    ``cuda_graph`` choose how a step runs; ``bf16`` needs ``fast_path``, and ``cuda_graph``
    ``on`` needs ``device`` ``cuda`` (``auto`` may resolve to the CPU on the worker)."""

    batch_size: StrictInt = Field(default=32, ge=1, le=4096)
    seed: StrictInt = Field(default=0, ge=0, le=2**31 - 1)
    fast_path: bool = Field(
        default=True,
        strict=True,
        description=(
            "Group the TT-linears' core merges and sibling products around each forward (the "
            "engine's fast path; same results to float rounding). false: each TT-linear merges "
            "its own cores (slower)."
        ),
    )
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description=(
            "fp32: float32 throughout. bf16: activations in bfloat16 under autocast (CPU and "
            "CUDA) with float32 master weights, gradients and optimizer state; needs fast_path "
            "true. A tensorized model that cannot use the fast path (recomputed blocks) fails "
            "at start with a 'validation' error on this field."
        ),
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description=(
            "auto: CUDA when the worker has a GPU, else the CPU (decided by the worker); cuda: "
            "the job fails ('validation', /training/device) on a worker without a GPU."
        ),
    )
    cuda_graph: Literal["auto", "on", "off"] = Field(
        default="auto",
        description=(
            "Capture the whole training step as a CUDA graph and replay it. auto: when the job "
            "runs on CUDA with an AdamW optimizer (comera, dense), eager otherwise or if a "
            "capture fails; on: required, so it needs device 'cuda' and a method other than "
            "galore, and a step that cannot be captured fails the job ('validation', "
            "/training/cuda_graph); off: never."
        ),
    )
    devices: StrictInt = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Processes (one per device) on each node: above 1 the job trains data parallel "
            "(DistributedDataParallel under torchrun); batch_size is the global batch and must "
            "divide among devices x nodes."
        ),
    )
    nodes: StrictInt = Field(
        default=1,
        ge=1,
        le=256,
        description=(
            "Machines: above 1 the job runs through Ray Train on the operator's Ray cluster "
            "(docs/distributed.md)."
        ),
    )
    grad_clip: float | None = Field(default=None, gt=0, le=1e6)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    log_every: StrictInt = Field(default=10, ge=1, le=100_000)
    eval_batches: StrictInt | None = Field(default=None, ge=1, le=100_000)

    @model_validator(mode="after")
    def _world_fits(self) -> TrainingSpec:
        """The global batch divides among the processes; CUDA graphs need one process (each
        error located at its field)."""
        world = self.devices * self.nodes
        errors = []
        if self.batch_size % world:
            msg = f"batch_size {self.batch_size} must divide among devices x nodes = {world}"
            errors.append(_located("batch_size", self.batch_size, msg))
        if self.cuda_graph == "on" and world > 1:
            msg = "'on' needs one process (devices and nodes 1)"
            errors.append(_located("cuda_graph", self.cuda_graph, msg))
        if errors:
            raise ValidationError.from_exception_data("TrainingSpec", errors)
        return self

    @field_validator("precision")
    @classmethod
    def _bf16_needs_fast_path(cls, v: str, info: ValidationInfo) -> str:
        if v == "bf16" and info.data.get("fast_path") is False:
            raise ValueError(
                "bf16 runs the TT layers through the fast path: set "
                "training.fast_path to true (or use fp32)"
            )
        return v

    @field_validator("cuda_graph")
    @classmethod
    def _on_needs_cuda(cls, v: str, info: ValidationInfo) -> str:
        device = info.data.get("device")
        if v == "on" and device is not None and device != "cuda":
            raise ValueError(
                f"'on' needs training.device 'cuda', got {device!r} (use 'auto' "
                "to capture graphs whenever the job runs on a GPU)"
            )
        return v


class LimitsSpec(StrictModel):
    max_wall_time_s: StrictInt = Field(default=6 * 3600, ge=10, le=7 * 24 * 3600)
    max_attempts: StrictInt = Field(default=3, ge=1, le=10)


class CheckpointingSpec(StrictModel):
    every_n_steps: StrictInt | None = Field(default=None, ge=1, le=MAX_STEPS)
    keep: StrictInt = Field(default=2, ge=1, le=20)
