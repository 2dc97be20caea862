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

The spec's parts: the model in :mod:`api_schemas.job_model`, the schedule and per-step settings
in :mod:`api_schemas.job_training`; both are re-exported here.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from api_schemas.common import StrictModel
from api_schemas.generator_limits import generator_errors, generator_of
from api_schemas.hf_model import HFConfigSource, relative_path
from api_schemas.job_model import (
    ARCHS,
    HF_PACKAGES,
    HF_RESERVED,
    PRETRAINED_ARCHS,
    ConfigValue,
    DistillSpec,
    HFDirSource,
    ModelSource,
    ModelSpec,
    PackageSource,
)
from api_schemas.job_training import (
    MAX_STEPS,
    CheckpointingSpec,
    LearningRatesSpec,
    LimitsSpec,
    Name,
    StageSpec,
    TrainingSpec,
)
from api_schemas.model_limits import MAX_TABLE_ROWS

__all__ = [
    "ARCHS",
    "CancelRequest",
    "CheckpointingSpec",
    "CompressionSpec",
    "DatasetSpec",
    "DistillSpec",
    "HF_PACKAGES",
    "HF_RESERVED",
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

# explicit modes: the product of either side at most twice the largest size any layer may have
# (a Criteo table), so no product overflows; the planner bounds it by the layer's own size
MAX_MODES_PRODUCT = 2 * MAX_TABLE_ROWS
Pattern = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\w.*?\[\]\-]+$")]
Labels = dict[
    Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[\w.\-/]+$")],
    Annotated[str, Field(max_length=256)],
]


class JobState(StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


# a generator's parameter: a model-config value, or a small map of names to numbers
# (stdlib_text's weights); each generator's own bounds: api_schemas.generator_limits
ParamValue = (
    ConfigValue
    | Annotated[
        dict[Annotated[str, Field(max_length=64)], StrictInt | StrictFloat], Field(max_length=16)
    ]
)


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
    params: dict[Annotated[str, Field(max_length=64)], ParamValue] = Field(
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

    check_paths = field_validator("path", "valid_path")(relative_path)


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
    # 256; with no d, TT linears of two cores); the default for a comera job with a
    # target_ratio that gives neither max_rank nor any stage's gamma (from-scratch
    # architectures; hf and hf_bert start from TT-SVD)
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
