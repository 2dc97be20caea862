"""The workloads the trainer knows: one entry per architecture.

A :class:`Workload` ties a model family to the trainer without the trainer knowing its
internals: it builds the model (dense or tensorized) from a config dict, and turns a batch
(a dict of tensors, keys in ``batch_keys``) into a task loss plus metric sums. Metric sums are
additive over batches (``count``, ``loss_sum``, ``correct``, ...); :meth:`Workload.summarize`
turns accumulated sums into the reported metrics (``loss``, ``accuracy``, ...).
:meth:`Workload.example_batch` draws a random valid batch (tests, benchmarks).

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

Tensorization options (:class:`~engine.models.tensorize.TensorizeOptions`, the job's
``compression`` section) reach every builder in full; ``shapes="paper"`` exists only for the
transformer.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.configs import ConfigError, parse
from engine.models.dlrm import DLRMConfig, build_dlrm
from engine.models.hf import HFConfig, build_hf, hf_loss
from engine.models.hf.prepare import prepare_hf_
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

__all__ = [
    "TensorizeOptions",
    "StepOutput",
    "Workload",
    "WORKLOADS",
    "get_workload",
    "build_model",
    "classification_output",
]


@dataclass
class StepOutput:
    """Task loss of one batch (mean, attached to the graph) and additive metric sums."""

    loss: Tensor  # () mean task loss
    sums: dict[str, Tensor]  # () each, detached: count, loss_sum, correct, ...


def classification_output(logits: Tensor, labels: Tensor) -> StepOutput:
    """Cross-entropy over ``logits (B, C)`` with ``labels (B,)``; sums for loss and accuracy."""
    loss = F.cross_entropy(logits, labels)  # ()
    with torch.no_grad():
        n = torch.tensor(float(labels.numel()), device=logits.device)
        correct = (logits.argmax(-1) == labels).sum().to(logits.dtype)  # ()
    return StepOutput(loss, {"count": n, "loss_sum": loss.detach() * n, "correct": correct})


def _compression_error(err: ValueError) -> ConfigError:
    """A build error under ``compression``: a ``ConfigError`` keeps its field (re-rooted;
    one already about ``model.config`` stays there), anything else is about the
    compression settings as a whole."""
    if isinstance(err, ConfigError):
        return err if err.field.startswith("model.config.") else err.under("compression")
    return ConfigError("compression", str(err))


def _lengths(batch: int, seq: int, g: torch.Generator | None) -> Tensor:
    """Random valid lengths in ``[max(1, seq // 2), seq]``, one row at full length."""
    lo = max(1, seq // 2)
    n = torch.randint(lo, seq + 1, (batch,), generator=g)  # (B,)
    n[0] = seq
    return n


class Workload:
    """Base class: subclasses set ``name``, ``config_cls``, ``batch_keys`` and override."""

    name: str = ""
    config_cls: type = object
    batch_keys: tuple[str, ...] = ()
    paper_shapes: bool = False  # whether compression.shapes="paper" means something here
    guard_metric: str = "accuracy"  # the validation metric the fidelity guard watches
    # layers with a residual path around them: only these may be pruned to rank 0
    bypassed: tuple[str, ...] = ()

    # -- config and model -------------------------------------------------------------------
    def config_from_dict(self, data: Mapping[str, Any]) -> Any:
        """The config dataclass from ``model.config``; errors name ``model.config.<field>``."""
        if not isinstance(data, Mapping):
            raise ConfigError("model.config", f"must be a mapping, got {type(data).__name__}")
        return parse(self.config_cls, {"version": 1, **data}, "model.config")

    def _config(self, config: Any) -> Any:
        if isinstance(config, Mapping):
            return self.config_from_dict(config)
        if not isinstance(config, self.config_cls):
            raise TypeError(
                f"model.config must be a {self.config_cls.__name__} or a mapping, "
                f"got {type(config).__name__}"
            )
        return config

    def build(self, config: Any, *, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        """The model, dense or tensorized; ``model.tensorize_report`` lists the layer choices."""
        config = self._config(config)
        if not isinstance(options, TensorizeOptions):
            raise TypeError(f"options must be TensorizeOptions, got {type(options).__name__}")
        if tensorized and options.shapes == "paper" and not self.paper_shapes:
            raise ConfigError(
                "compression.shapes",
                f"'paper' is defined only for the transformer "
                f"(the paper's MNLI shapes); use 'auto' for arch {self.name!r}",
            )
        try:
            return self._build(config, tensorized, options)
        except ValueError as err:
            if not tensorized:
                raise
            raise _compression_error(err) from None

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        raise NotImplementedError

    # -- data and loss ----------------------------------------------------------------------
    def example_batch(
        self,
        config: Any,
        batch_size: int,
        generator: torch.Generator | None = None,
        *,
        seq_len: int | None = None,
    ) -> dict[str, Tensor]:
        """A random valid CPU batch (``seq_len`` only for sequence models; default 16)."""
        config = self._config(config)
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, numbers.Integral)
            or (batch_size < 1)
        ):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        return self._example(config, int(batch_size), generator, seq_len)

    def _example(
        self, config: Any, b: int, g: torch.Generator | None, seq_len: int | None
    ) -> dict[str, Tensor]:
        raise NotImplementedError

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        raise NotImplementedError

    def manifest_config(self, config: Any) -> dict[str, Any]:
        """The ``model_config`` an export records: what rebuilds the architecture."""
        return self._config(config).to_dict()

    def guard_metric_of(self, config: Any) -> str:
        """The validation metric the fidelity guard watches for ``config`` (higher is better)."""
        return self.guard_metric

    def plan_config(self, config: Any) -> Any:
        """The config a dry-run plan builds on the ``meta`` device (shapes, no weights read).
        Default: ``config`` itself."""
        return self._config(config)

    def prepare(
        self, model: nn.Module, batches: Iterable[Mapping[str, Tensor]], *, device: torch.device
    ) -> dict[str, Any] | None:
        """Data-dependent set-up of a freshly built model before its first step (the trainer
        passes the training batches of epoch 0; not called on resume). Default: nothing."""
        return None

    def setup(
        self, model: nn.Module, train: Any, job: Any, *, device: torch.device
    ) -> dict[str, Any] | None:
        """Set-up outside the model's state before the first step, the same for a fresh and
        a resumed run (``train``: the training source; ``job``: the job config); what it did,
        for the report. Default: nothing."""
        return None

    def label_counts(self, batch: Mapping[str, Tensor]) -> Tensor | None:
        """Histogram (C,) of the labels a batch is scored on (the chance level); None when
        the task has no classes."""
        labels = batch.get("labels")
        if labels is None or labels.dtype != torch.long:
            return None
        return torch.bincount(labels[labels >= 0].flatten())

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Reported metrics from accumulated sums: mean ``loss`` and ``accuracy``."""
        n = max(sums.get("count", 0.0), 1.0)
        out = {"loss": sums.get("loss_sum", 0.0) / n}
        if "correct" in sums:
            out["accuracy"] = sums["correct"] / n
        return out


def _seq_len(config: Any, seq_len: int | None) -> int:
    s = min(config.max_len, 16) if seq_len is None else seq_len
    if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 1 <= s <= config.max_len:
        raise ValueError(f"seq_len must be an integer in [1, {config.max_len}], got {s!r}")
    return int(s)


class TransformerWorkload(Workload):
    """Sentence(-pair) classification with the paper's encoder classifier."""

    name = "transformer"
    config_cls = TransformerConfig
    batch_keys = ("input_ids", "token_type_ids", "attention_mask", "labels")
    paper_shapes = True
    bypassed = ("encoder.*.ffn.*",)

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        shapes = "mnli" if options.shapes == "paper" else "auto"
        if tensorized and shapes == "mnli":
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
        return build_transformer(
            config, tensorized=tensorized, shapes=shapes, **options.builder_kwargs()
        )

    def _example(self, config, b, g, seq_len):
        s = _seq_len(config, seq_len)
        ids = torch.randint(0, config.vocab_size, (b, s), generator=g)  # (B, S)
        second = (torch.arange(s) >= s // 2) & (config.type_vocab > 1)  # (S,)
        types = second.long().expand(b, s).clone()  # (B, S)
        mask = torch.arange(s) < _lengths(b, s, g)[:, None]  # (B, S)
        labels = torch.randint(0, config.num_classes, (b,), generator=g)  # (B,)
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels}

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        logits = model(
            batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask")
        )  # (B, C)
        return classification_output(logits, batch["labels"])


class DLRMWorkload(Workload):
    """Click-through prediction: one logit per row, binary cross-entropy."""

    name = "dlrm"
    config_cls = DLRMConfig
    batch_keys = ("dense", "sparse", "labels")

    def label_counts(self, batch: Mapping[str, Tensor]) -> Tensor | None:
        """Clicks and non-clicks (float labels in {0, 1})."""
        return torch.bincount((batch["labels"] > 0.5).long().flatten(), minlength=2)

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        return build_dlrm(config, tensorized=tensorized, **options.builder_kwargs())

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


class MLMWorkload(Workload):
    """Masked-language-model pre-training: CE over the positions whose label is not -100."""

    name = "mlm"
    config_cls = MLMConfig
    batch_keys = ("input_ids", "attention_mask", "labels")
    bypassed = ("encoder.*.ffn.*",)

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        return build_mlm(config, tensorized=tensorized, **options.builder_kwargs())

    def _example(self, config, b, g, seq_len):
        """15% of the valid positions (at least one a row) carry labels; their input id is
        replaced by ``vocab_size - 1``, standing in for ``[MASK]``."""
        s = _seq_len(config, seq_len)
        ids = torch.randint(0, config.vocab_size, (b, s), generator=g)  # (B, S)
        n = _lengths(b, s, g)  # (B,)
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


class MLPWorkload(Workload):
    """Classification of flat feature vectors (tabular rows, flattened images)."""

    name = "mlp"
    config_cls = MLPConfig
    batch_keys = ("x", "labels")

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        return build_mlp(config, tensorized=tensorized, **options.builder_kwargs())

    def _example(self, config, b, g, seq_len):
        x = torch.randn(b, config.in_features, generator=g)  # (B, F)
        labels = torch.randint(0, config.num_classes, (b,), generator=g)  # (B,)
        return {"x": x, "labels": labels}

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        return classification_output(model(batch["x"]), batch["labels"])  # (B, C) logits


class HFBertWorkload(Workload):
    """A pretrained BERT encoder compressed from TT-SVD and distilled from the original."""

    name = "hf_bert"
    config_cls = HFBertConfig
    batch_keys = ("input_ids", "attention_mask", "token_type_ids")
    guard_metric = "cosine"
    bypassed = ("encoder.*.ffn.*",)

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        return build_hf_bert(config, tensorized=tensorized, options=options)

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
        mask = torch.arange(s) < _lengths(b, s, g)[:, None]  # (B, S)
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


class HFWorkload(Workload):
    """A Hugging Face model on transformers' own classes (:mod:`engine.models.hf`): from
    pretrained weights (TT-SVD, then distillation from the original) or from a config."""

    name = "hf"
    config_cls = HFConfig
    batch_keys = ("input_ids", "attention_mask", "token_type_ids", "labels")

    def _build(self, config: Any, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        return build_hf(config, tensorized=tensorized, options=options)

    def _example(self, config, b, g, seq_len):
        cfg = config.transformers_config()
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 512)
        s = min(limit, 16) if seq_len is None else seq_len
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 2 <= s <= limit:
            raise ValueError(f"seq_len must be an integer in [2, {limit}], got {s!r}")
        ids = torch.randint(0, cfg.vocab_size, (b, s), generator=g)  # (B, S)
        mask = torch.arange(s) < _lengths(b, s, g)[:, None]  # (B, S)
        batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        if config.task == "sequence_classification":
            batch["labels"] = torch.randint(0, cfg.num_labels, (b,), generator=g)  # (B,)
        return batch

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        loss, sums = hf_loss(model, batch)  # type: ignore[arg-type]
        return StepOutput(loss, sums)

    def prepare(self, model, batches, *, device):
        """``init="whitened"`` (pretrained): activation-aware TT-SVD on training sentences."""
        return prepare_hf_(model, batches, device=device)

    def guard_metric_of(self, config: Any) -> str:
        task = self._config(config).task
        return "cosine" if task == "sentence_embedding" else "accuracy"

    def plan_config(self, config: Any) -> Any:
        """The architecture alone: the original's weights are neither read nor decomposed."""
        return self.config_from_dict(self._config(config).portable_dict())

    def manifest_config(self, config: Any) -> dict[str, Any]:
        """``config.json`` in full, no ``path``: a checkpoint rebuilds the architecture."""
        return self._config(config).portable_dict()

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """``loss``; ``accuracy`` (next / masked token or class); ``perplexity`` of the LM
        tasks (exp of the mean token NLL); ``cosine`` for sentence embeddings."""
        n = max(sums.get("count", 0.0), 1.0)
        out = {"loss": sums.get("loss_sum", 0.0) / n}
        if "correct" in sums:
            out["accuracy"] = sums["correct"] / n
        if "nll_sum" in sums:
            nll = sums["nll_sum"] / n
            out["perplexity"] = math.exp(nll) if nll < 700 else math.inf
        if "cosine_sum" in sums:
            out["cosine"] = sums["cosine_sum"] / n
        return out


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        TransformerWorkload(),
        DLRMWorkload(),
        MLMWorkload(),
        MLPWorkload(),
        HFBertWorkload(),
        HFWorkload(),
    )
}


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
