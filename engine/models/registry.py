"""The workloads the trainer knows: one entry per architecture.

Each :class:`~engine.models.workload.Workload` (the contract, in its own module) ties a model
family to the trainer; this module holds the built-in ones, each registered in ``WORKLOADS`` by
:func:`~engine.models.workload.register_workload`.

Batches per architecture:

* ``transformer``: ``input_ids`` (B, S) long, ``token_type_ids`` (B, S) long,
  ``attention_mask`` (B, S) bool, ``labels`` (B,) long.
* ``dlrm``: ``dense`` (B, n_dense) float, ``sparse`` (B, n_tables) long (column ``j`` in
  ``[0, table_sizes[j])``), ``labels`` (B,) float in {0, 1}.
* ``mlm``: ``input_ids`` (B, S) long, ``attention_mask`` (B, S) bool, ``labels`` (B, S) long,
  ``-100`` where no loss is taken (optional ``token_type_ids``).
* ``mlp``: ``x`` (B, in_features) float, ``labels`` (B,) long.
* ``hf_bert``: ``input_ids`` (B, S) long, ``attention_mask`` (B, S) bool, optional
  ``token_type_ids`` (B, S) long; no labels: the loss is distillation from the original model
  (:func:`engine.models.hf_bert.distill_loss`), the metric the student/teacher ``cosine``.
* ``hf``: ``input_ids``, ``attention_mask`` (B, S), optional ``token_type_ids`` (B, S) and, for
  classification, ``labels`` (B,) (:mod:`engine.models.hf.workload`).

Tensorization options (:class:`~engine.models.tensorize.TensorizeOptions`, the job's
``compression`` section) reach every builder in full; ``shapes="paper"`` exists only for the
transformer.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.configs import ConfigError
from engine.models.dlrm import DLRMConfig, build_dlrm
from engine.models.hf.workload import HFWorkload
from engine.models.hf_bert import (
    HFBertConfig,
    attach_teacher_embeddings_,
    build_hf_bert,
    distill_loss,
    prepare_student_,
)
from engine.models.mlm import IGNORE_INDEX, MLMConfig, build_mlm, masked_lm_loss
from engine.models.mlp import MLPConfig, build_mlp
from engine.models.tensorize import TensorizeOptions
from engine.models.transformer import TransformerConfig, _check_mnli, build_transformer
from engine.models.workload import (
    WORKLOADS,
    StepOutput,
    Workload,
    classification_output,
    example_lengths,
    register_workload,
    seq_len_of,
)

__all__ = [
    "TensorizeOptions",
    "StepOutput",
    "Workload",
    "WORKLOADS",
    "register_workload",
    "get_workload",
    "build_model",
    "classification_output",
]


@register_workload
class TransformerWorkload(Workload):
    """Sentence(-pair) classification with the paper's encoder classifier."""

    name = "transformer"
    config_cls = TransformerConfig
    batch_keys = ("input_ids", "token_type_ids", "attention_mask", "labels")
    paper_shapes = True
    bypassed = ("encoder.*.ffn.*",)

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        if tensorized and options.shapes == "paper":
            if options.d is not None:
                raise ConfigError(
                    "d",
                    f"must be null with compression.shapes='paper' "
                    f"(the paper fixes the modes), got {options.d}",
                )
            try:
                _check_mnli(config)
            except ValueError as err:
                raise ConfigError("shapes", f"'paper': {err}") from None
        return build_transformer(config, tensorized=tensorized, options=options)

    def _example(self, config, b, g, seq_len):
        s = seq_len_of(config, seq_len)
        ids = torch.randint(0, config.vocab_size, (b, s), generator=g)  # (B, S)
        second = (torch.arange(s) >= s // 2) & (config.type_vocab > 1)  # (S,)
        types = second.long().expand(b, s).clone()  # (B, S)
        mask = torch.arange(s) < example_lengths(b, s, g)[:, None]  # (B, S)
        labels = torch.randint(0, config.num_classes, (b,), generator=g)  # (B,)
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels}

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        logits = model(
            batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask")
        )  # (B, C)
        return classification_output(logits, batch["labels"])


@register_workload
class DLRMWorkload(Workload):
    """Click-through prediction: one logit per row, binary cross-entropy."""

    name = "dlrm"
    config_cls = DLRMConfig
    batch_keys = ("dense", "sparse", "labels")

    def label_counts(self, batch: Mapping[str, Tensor]) -> Tensor | None:
        """Clicks and non-clicks (float labels in {0, 1})."""
        return torch.bincount((batch["labels"] > 0.5).long().flatten(), minlength=2)

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        return build_dlrm(config, tensorized=tensorized, options=options)

    def _example(self, config, b, g, seq_len):
        dense = torch.randn(b, config.n_dense, generator=g)  # (B, n_dense)
        sizes = torch.tensor(config.table_sizes, dtype=torch.float64)  # (T,)
        u = torch.rand(b, config.n_tables, generator=g, dtype=torch.float64)  # (B, T)
        sparse = (u * sizes).long().minimum(sizes.long() - 1)  # (B, T)
        labels = (torch.rand(b, generator=g) < 0.5).float()  # (B,)
        return {"dense": dense, "sparse": sparse, "labels": labels}

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        logits = model(batch["dense"], batch["sparse"])  # (B,)
        labels = batch["labels"].to(logits.dtype)  # (B,)
        loss = F.binary_cross_entropy_with_logits(logits, labels)  # ()
        with torch.no_grad():
            n = torch.tensor(float(labels.numel()), device=logits.device)
            correct = ((logits > 0) == (labels > 0.5)).sum().to(logits.dtype)  # ()
        return StepOutput(loss, {"count": n, "loss_sum": loss.detach() * n, "correct": correct})


@register_workload
class MLMWorkload(Workload):
    """Masked-language-model pre-training: CE over the positions whose label is not -100."""

    name = "mlm"
    config_cls = MLMConfig
    batch_keys = ("input_ids", "attention_mask", "labels")
    bypassed = ("encoder.*.ffn.*",)

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        return build_mlm(config, tensorized=tensorized, options=options)

    def _example(self, config, b, g, seq_len):
        """15% of the valid positions (at least one a row) carry labels; their input id is
        replaced by ``vocab_size - 1``, standing in for ``[MASK]``."""
        s = seq_len_of(config, seq_len)
        ids = torch.randint(0, config.vocab_size, (b, s), generator=g)  # (B, S)
        n = example_lengths(b, s, g)  # (B,)
        valid = torch.arange(s) < n[:, None]  # (B, S)
        chosen = (torch.rand(b, s, generator=g) < 0.15) & valid  # (B, S)
        one = (torch.rand(b, generator=g) * n).long()  # (B,) a valid position per row
        chosen[torch.arange(b), one] = True
        labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))  # (B, S)
        inputs = ids.masked_fill(chosen, config.vocab_size - 1)  # (B, S)
        return {"input_ids": inputs, "attention_mask": valid, "labels": labels}

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        labels = batch["labels"]  # (B, S)
        select = labels != IGNORE_INDEX  # (B, S)
        logits = model(
            batch["input_ids"],
            batch.get("attention_mask"),
            batch.get("token_type_ids"),
            select=select,
        )  # (N, V)
        loss, sums = masked_lm_loss(logits, labels[select])
        return StepOutput(loss, sums)

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """``loss``, ``accuracy`` (over masked tokens) and ``perplexity = exp(loss)``."""
        out = super().summarize(sums)
        out["perplexity"] = math.exp(out["loss"]) if out["loss"] < 700 else math.inf
        return out


@register_workload
class MLPWorkload(Workload):
    """Classification of flat feature vectors (tabular rows, flattened images)."""

    name = "mlp"
    config_cls = MLPConfig
    batch_keys = ("x", "labels")

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        return build_mlp(config, tensorized=tensorized, options=options)

    def _example(self, config, b, g, seq_len):
        x = torch.randn(b, config.in_features, generator=g)  # (B, F)
        labels = torch.randint(0, config.num_classes, (b,), generator=g)  # (B,)
        return {"x": x, "labels": labels}

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        return classification_output(model(batch["x"]), batch["labels"])  # (B, C) logits


@register_workload
class HFBertWorkload(Workload):
    """A pretrained BERT encoder compressed from TT-SVD and distilled from the original."""

    name = "hf_bert"
    config_cls = HFBertConfig
    batch_keys = ("input_ids", "attention_mask", "token_type_ids")
    guard_metric = "cosine"
    bypassed = ("encoder.layer.*.intermediate.dense", "encoder.layer.*[0-9].output.dense")

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        return build_hf_bert(config, tensorized=tensorized, options=options)

    def upgrade_checkpoint(self, manifest, tensors):
        """Checkpoints of the earlier hand-written encoder (``engine.models.hf_bert.legacy``)."""
        from engine.models.hf_bert.legacy import upgrade_names

        return upgrade_names(manifest, tensors)

    def _example(self, config, b, g, seq_len):
        arch = config.arch
        s = min(arch.max_position_embeddings, 16) if seq_len is None else seq_len
        if (
            isinstance(s, bool)
            or not isinstance(s, numbers.Integral)
            or not (1 <= s <= arch.max_position_embeddings)
        ):
            raise ValueError(
                f"seq_len must be an integer in [1, {arch.max_position_embeddings}], got {s!r}"
            )
        ids = torch.randint(0, arch.vocab_size, (b, s), generator=g)  # (B, S)
        mask = torch.arange(s) < example_lengths(b, s, g)[:, None]  # (B, S)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        loss, sums = distill_loss(model, batch)  # type: ignore[arg-type]
        return StepOutput(loss, sums)

    def prepare(self, model, batches, *, device):
        """``init="whitened"``: activation-aware TT-SVD on training sentences."""
        return prepare_student_(model, batches, device=device)

    def setup(self, model, train, job, *, device):
        """The teacher's embeddings of the training split, when they pay
        (:mod:`engine.models.hf_bert.cache`)."""
        return attach_teacher_embeddings_(
            model, train, job.schedule, job.training.batch_size, device=device
        )

    def plan_config(self, config: Any) -> Any:
        """Without ``path``: the bare architecture (fresh TT layers of the same shapes and
        initial ranks; the original's weights are neither read nor decomposed)."""
        return self._config(config).replace(path=None)

    def manifest_config(self, config: Any) -> dict[str, Any]:
        """Without ``path``: a checkpoint rebuilds from ``architecture``, not the original."""
        return self._config(config).portable_dict()

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """``loss`` and ``cosine``: mean student / teacher sentence-embedding cosine."""
        n = max(sums.get("count", 0.0), 1.0)
        return {"loss": sums.get("loss_sum", 0.0) / n, "cosine": sums.get("cosine_sum", 0.0) / n}


register_workload(HFWorkload)  # defined in engine.models.hf.workload


def get_workload(arch: str) -> Workload:
    """The workload for ``arch``; an unknown name raises naming the field ``model.arch``."""
    try:
        return WORKLOADS[arch]
    except (KeyError, TypeError):
        raise ConfigError(
            "model.arch", f"unknown architecture {arch!r}; choose one of {sorted(WORKLOADS)}"
        ) from None


def build_model(
    arch: str,
    config: Mapping[str, Any] | Any,
    *,
    tensorized: bool,
    options: TensorizeOptions | None = None,
) -> nn.Module:
    """``get_workload(arch).build(...)`` from a config dict or dataclass; options default."""
    options = options if options is not None else TensorizeOptions()
    return get_workload(arch).build(config, tensorized=tensorized, options=options)
