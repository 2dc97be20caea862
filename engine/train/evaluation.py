"""Validation passes and the chance-level check of a final metric.

:func:`evaluate` runs the workload's loss over the validation batches (at most ``limit``) and
returns the summarized metrics with the label histogram seen (for classification workloads).

:func:`chance_report` says whether an accuracy is no better than chance: the larger of the
majority-class rate of the validation labels and the uniform rate ``1 / classes``. A model
that ends there learned nothing, whatever its compression; the report flags it
(``at_chance``) so that neither a user nor a benchmark mistakes it for a result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["evaluate", "chance_report", "CHANCE_MARGIN"]

CHANCE_MARGIN = 0.01  # an accuracy within one point of chance counts as chance


@torch.no_grad()
def evaluate(
    model: nn.Module,
    workload: Any,
    batches: Iterable[Mapping[str, Tensor]],
    *,
    device: torch.device,
    forward_context: Any,
    limit: int | None = None,
) -> tuple[dict[str, float], Tensor | None]:
    """``(metrics, label_counts)`` over at most ``limit`` batches (``model`` left in eval)."""
    model.eval()
    sums: dict[str, float] = {}
    counts: Tensor | None = None
    for i, batch in enumerate(batches):
        if limit is not None and i >= limit:
            break
        batch = {k: v.to(device) for k, v in batch.items()}
        with forward_context():
            out = workload.forward_loss(model, batch)
        for k, v in out.sums.items():
            sums[k] = sums.get(k, 0.0) + float(v.item() if isinstance(v, Tensor) else v)
        seen = workload.label_counts(batch)  # (C,) or None
        if seen is not None:
            seen = seen.cpu()
            if counts is None:
                counts = seen
            else:
                width = max(counts.numel(), seen.numel())
                counts = _pad(counts, width) + _pad(seen, width)
    return workload.summarize(sums), counts


def _pad(t: Tensor, width: int) -> Tensor:
    return torch.cat([t, t.new_zeros(width - t.numel())]) if t.numel() < width else t


def chance_report(
    metrics: Mapping[str, float], counts: Tensor | None, classes: int | None
) -> dict[str, Any] | None:
    """``{metric, value, majority, uniform, chance, at_chance}`` for an accuracy, else None."""
    value = metrics.get("accuracy")
    if value is None or counts is None or int(counts.sum()) == 0:
        return None
    total = int(counts.sum())
    majority = int(counts.max()) / total
    uniform = 1.0 / max(classes or counts.numel(), 1)
    chance = max(majority, uniform)
    return {
        "metric": "accuracy",
        "value": value,
        "majority": majority,
        "uniform": uniform,
        "chance": chance,
        "at_chance": value <= chance + CHANCE_MARGIN,
    }
