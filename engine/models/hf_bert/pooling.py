"""Sentence embeddings from hidden states: the mean over the attended tokens (a leaf module)."""

from __future__ import annotations

from torch import Tensor

__all__ = ["mean_pool"]


def mean_pool(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Mean of ``hidden (B, S, D)`` over the attended positions: ``(B, D)``."""
    if attention_mask is None:
        return hidden.mean(1)  # (B, D)
    w = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, S, 1)
    total = (hidden * w).sum(1)  # (B, D)
    return total / w.sum(1).clamp_min(1e-9)  # (B, D)
