"""The distillation loss of the ``hf_bert`` workload: the student against the frozen original."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.configs import ConfigError
from engine.models.hf_bert.model import SentenceEncoder
from engine.models.hf_bert.pooling import mean_pool

__all__ = ["distill_loss"]


def distill_loss(model: SentenceEncoder, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict]:
    """``(distill_weight * loss, sums)``; sums: ``count``, ``loss_sum``, ``cosine_sum``.

    ``mse_hidden``: mean squared difference of the last hidden states over attended tokens;
    ``cosine_embedding``: mean ``1 - cos`` of the pooled sentence embeddings; ``none``: zero.
    ``cosine_sum`` is always the summed student/teacher cosine of the sentence embeddings.
    With ``cosine_embedding`` the teacher's embeddings come from ``model.teacher_embeddings``
    when it holds every sentence of the batch (the teacher runs otherwise).
    """
    teacher = model.teacher
    if teacher is None:
        raise ConfigError(
            "model.config.path",
            "distillation needs the original model (this "
            "encoder was built without a path, e.g. loaded from a checkpoint)",
        )
    ids, mask = batch["input_ids"], batch["attention_mask"]  # (B, S) each
    types = batch.get("token_type_ids")
    hidden = model(ids, mask, types)  # (B, S, D)
    emb = mean_pool(hidden, mask)  # (B, D)
    kind = model.config.distill
    table = model.teacher_embeddings if kind == "cosine_embedding" else None
    t_emb = None if table is None else table.lookup(ids, mask, types)  # (B, D) or None
    if t_emb is None:
        with torch.no_grad():
            t_hidden = teacher(ids, mask, types)  # (B, S, D)
            t_emb = mean_pool(t_hidden, mask)  # (B, D)
    cos = F.cosine_similarity(emb, t_emb.to(emb.dtype), dim=-1)  # (B,)
    if kind == "cosine_embedding":
        loss = (1.0 - cos).mean()  # ()
    elif kind == "mse_hidden":
        w = mask.to(hidden.dtype).unsqueeze(-1)  # (B, S, 1)
        sq = ((hidden - t_hidden) ** 2 * w).sum()  # ()
        loss = sq / (w.sum() * hidden.shape[-1]).clamp_min(1.0)  # ()
    else:
        loss = hidden.sum() * 0.0  # () attached to the graph, zero gradient
    loss = loss * model.config.distill_weight  # ()
    with torch.no_grad():
        n = torch.tensor(float(ids.shape[0]), device=hidden.device)
        sums = {"count": n, "loss_sum": loss.detach() * n, "cosine_sum": cos.sum()}
    return loss, sums
