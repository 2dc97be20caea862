"""The workloads the trainer knows: one entry per architecture.

A :class:`Workload` ties a model family to the trainer without the trainer knowing its
internals: it builds the model (dense or tensorized) from a config dict, and turns a batch
(a dict of tensors, keys in ``batch_keys``) into a task loss plus metric sums. Metric sums are
additive over batches (``count``, ``loss_sum``, ``correct``, ...); :meth:`Workload.summarize`
turns accumulated sums into the reported metrics (``loss``, ``accuracy``, ...).

Batches per architecture:

* ``transformer``: ``input_ids`` (B, S) long, ``token_type_ids`` (B, S) long,
  ``attention_mask`` (B, S) bool, ``labels`` (B,) long.
"""

from __future__ import annotations

import fnmatch
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.models.transformer import TransformerConfig, build_transformer

__all__ = [
    "TensorizeOptions",
    "StepOutput",
    "Workload",
    "WORKLOADS",
    "get_workload",
    "classification_output",
]


@dataclass(frozen=True)
class TensorizeOptions:
    """How a workload builds its tensorized layers (ignored for dense models).

    ``shapes="paper"`` uses the architecture's published shapes where it has them (the MNLI
    transformer of method doc §2.3), ``"auto"`` factorizes every layer automatically.
    ``layers`` are ``fnmatch`` patterns over module names (``encoder.*.ffn.*``); a layer is
    tensorized when it is tensorizable by its architecture and matches one pattern.
    """

    max_rank: int = 30
    embedding_max_rank: int | None = None  # None: max_rank
    gate_threshold: float = 1e-2
    shapes: str = "auto"
    d: int | None = None
    layers: tuple[str, ...] = ("*",)

    def __post_init__(self) -> None:
        for name in ("max_rank", "embedding_max_rank", "d"):
            v = getattr(self, name)
            if v is None and name != "max_rank":
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        t = self.gate_threshold
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 <= t < 1:
            raise ValueError(f"gate_threshold must be in [0, 1), got {t!r}")
        if self.shapes not in ("auto", "paper"):
            raise ValueError(f"shapes must be 'auto' or 'paper', got {self.shapes!r}")
        layers = self.layers
        if isinstance(layers, str) or not all(isinstance(p, str) and p for p in layers):
            raise ValueError(f"layers must be a list of non-empty name patterns, got {layers!r}")
        object.__setattr__(self, "layers", tuple(layers))

    @property
    def embedding_rank(self) -> int:
        return self.embedding_max_rank if self.embedding_max_rank is not None else self.max_rank

    def selects(self, name: str) -> bool:
        """Whether the module called ``name`` should be tensorized."""
        return any(fnmatch.fnmatchcase(name, p) for p in self.layers)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layers"] = list(self.layers)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorizeOptions:
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"TensorizeOptions: unknown keys {unknown}")
        data = dict(data)
        if "layers" in data and isinstance(data["layers"], list):
            data["layers"] = tuple(data["layers"])
        return cls(**data)


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


class Workload:
    """Base class: subclasses set ``name``, ``config_cls``, ``batch_keys`` and override."""

    name: str = ""
    config_cls: type = object
    batch_keys: tuple[str, ...] = ()

    def config_from_dict(self, data: Mapping[str, Any]) -> Any:
        return self.config_cls.from_dict({"version": 1, **data})  # type: ignore[attr-defined]

    def build(self, config: Any, *, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        raise NotImplementedError

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        raise NotImplementedError

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Reported metrics from accumulated sums: mean ``loss`` and ``accuracy``."""
        n = max(sums.get("count", 0.0), 1.0)
        out = {"loss": sums.get("loss_sum", 0.0) / n}
        if "correct" in sums:
            out["accuracy"] = sums["correct"] / n
        return out


class TransformerWorkload(Workload):
    """Sentence(-pair) classification with the paper's encoder classifier."""

    name = "transformer"
    config_cls = TransformerConfig
    batch_keys = ("input_ids", "token_type_ids", "attention_mask", "labels")

    def build(self, config: Any, *, tensorized: bool, options: TensorizeOptions) -> nn.Module:
        shapes = "mnli" if options.shapes == "paper" else "auto"
        return build_transformer(config, tensorized=tensorized, max_rank=options.max_rank,
                                 shapes=shapes)

    def forward_loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        logits = model(batch["input_ids"], batch.get("token_type_ids"),
                       batch.get("attention_mask"))  # (B, C)
        return classification_output(logits, batch["labels"])


WORKLOADS: dict[str, Workload] = {w.name: w for w in (TransformerWorkload(),)}


def get_workload(arch: str) -> Workload:
    """The workload for ``arch``; an unknown name raises naming the field ``model.arch``."""
    try:
        return WORKLOADS[arch]
    except (KeyError, TypeError):
        raise ValueError(
            f"model.arch: unknown architecture {arch!r}; choose one of {sorted(WORKLOADS)}"
        ) from None
