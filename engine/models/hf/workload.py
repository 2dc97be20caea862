"""The ``hf`` workload's entry in the registry (:mod:`engine.models.registry`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from engine.models.hf.config import HFConfig
from engine.models.hf.losses import hf_loss
from engine.models.hf.model import build_hf
from engine.models.hf.prepare import prepare_hf_
from engine.models.hf_bert.cache import attach_teacher_embeddings_
from engine.models.tensorize import TensorizeOptions
from engine.models.workload import StepOutput, Workload, example_lengths

__all__ = ["HFWorkload"]


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
        mask = torch.arange(s) < example_lengths(b, s, g)[:, None]  # (B, S)
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

    def setup(self, model, train, job, *, device):
        """``sentence_embedding``: the teacher's embeddings of the training split, when they
        pay (:mod:`engine.models.hf_bert.cache`)."""
        return attach_teacher_embeddings_(
            model, train, job.schedule, job.training.batch_size, device=device
        )

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
