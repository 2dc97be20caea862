"""The losses and metric sums of the ``hf`` workload, one function per task.

Every task returns ``(loss, sums)``: ``loss`` the mean objective attached to the graph,
``sums`` additive over batches (``count``, ``loss_sum`` and the task's own). With a teacher
(a pretrained start) the objective is ``task_weight * task + distill_weight * distill``:

* LM tasks: ``T^2 KL(softmax(t / T) || softmax(s / T))`` over the predicted positions;
* classification: the mean squared difference of the last hidden states over attended tokens
  (the original's head is usually not trained for the user's labels);
* sentence embeddings: ``1 - cos`` of the mean-pooled last hidden states (no task loss),
  plus ``token_weight`` times the mean ``1 - cos`` of each attended token's last hidden
  state;
  the teacher's side looked up in the training split's table when the job built one
  (:mod:`engine.models.hf_bert.cache`).

Masked LM masks 15% of the attended tokens of each row (never its first and last, which
tokenizers use for markers), at positions drawn by a hash of the row's own tokens, so the
same row is masked the same way whatever batch, process or epoch it comes in.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.configs import ConfigError
from engine.models.hf.model import HFModel
from engine.models.hf_bert.pooling import mean_pool

__all__ = ["hf_loss", "lm_mask", "MASK_PROBABILITY"]

MASK_PROBABILITY = 0.15
_MIX = 0x9E3779B97F4A7C15 & 0x7FFFFFFFFFFFFFFF  # odd 63-bit constant (golden ratio)


def _kl(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """``T^2 KL(p_t || p_s)`` per row of ``(N, V)`` logits: (N,)."""
    t = temperature
    log_s = F.log_softmax(student / t, dim=-1)  # (N, V)
    log_t = F.log_softmax(teacher.to(student.dtype) / t, dim=-1)  # (N, V)
    return (log_t.exp() * (log_t - log_s)).sum(-1) * t * t  # (N,)


def lm_mask(input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Positions (B, S) bool to mask: ~15% of each row's inner attended tokens, at least one
    where the row has any; a pure function of the row's tokens."""
    b, s = input_ids.shape
    pos = torch.arange(s, device=input_ids.device)  # (S,)
    lengths = attention_mask.sum(1, keepdim=True)  # (B, 1)
    inner = attention_mask & (pos > 0) & (pos < lengths - 1)  # (B, S)
    row = (input_ids * attention_mask).sum(1, keepdim=True)  # (B, 1) the row's own seed
    h = (input_ids * 1_000_003 + pos * 7_919 + row * 104_729) & 0x7FFFFFFF  # (B, S)
    h = (h * _MIX) & 0x7FFFFFFFFFFFFFFF
    h = (h >> 31) % 10_000  # (B, S) in [0, 10000)
    chosen = inner & (h < int(MASK_PROBABILITY * 10_000))  # (B, S)
    score = torch.where(inner, h, torch.full_like(h, -1))  # (B, S)
    force = torch.zeros_like(chosen)
    force[torch.arange(b), score.argmax(1)] = True  # (B, S) one inner position a row
    empty = ~chosen.any(1, keepdim=True) & inner.any(1, keepdim=True)  # (B, 1)
    return chosen | (force & empty)


def _lm_sums(
    logits: Tensor, targets: Tensor, distill: Tensor | None, model: HFModel
) -> tuple[Tensor, dict[str, Tensor]]:
    """Objective and sums over predicted positions: logits (N, V), targets (N,)."""
    cfg = model.config
    nll = F.cross_entropy(logits, targets, reduction="none")  # (N,)
    n = torch.tensor(float(targets.numel()), device=logits.device)
    per = cfg.task_weight * nll  # (N,)
    if distill is not None:
        per = per + cfg.distill_weight * distill  # (N,)
    loss = per.sum() / n.clamp_min(1.0)  # ()
    with torch.no_grad():
        sums = {
            "count": n,
            "loss_sum": per.sum().detach(),
            "nll_sum": nll.sum().detach(),
            "correct": (logits.argmax(-1) == targets).sum().to(logits.dtype),
        }
    return loss, sums


def _causal_lm(model: HFModel, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict]:
    ids, mask = batch["input_ids"], batch["attention_mask"]  # (B, S) each
    logits = model(ids, mask)  # (B, S, V)
    keep = mask[:, 1:] & mask[:, :-1]  # (B, S-1) predicted positions
    pred = logits[:, :-1][keep]  # (N, V)
    targets = ids[:, 1:][keep]  # (N,)
    distill = None
    if model.teacher is not None and model.config.distill_weight > 0:
        with torch.no_grad():
            t_logits = model.call(model.teacher, ids, mask).logits  # (B, S, V)
        distill = _kl(pred, t_logits[:, :-1][keep], model.config.temperature)  # (N,)
    return _lm_sums(pred, targets, distill, model)


def _masked_lm(model: HFModel, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict]:
    ids, mask = batch["input_ids"], batch["attention_mask"]  # (B, S) each
    types = batch.get("token_type_ids")
    mask_id = model.config.mask_token_id
    if mask_id is None:
        raise ConfigError("model.config.mask_token_id", "masked_lm needs the [MASK] token id")
    chosen = lm_mask(ids, mask)  # (B, S)
    inputs = ids.masked_fill(chosen, mask_id)  # (B, S)
    logits = model(inputs, mask, types)  # (B, S, V)
    pred, targets = logits[chosen], ids[chosen]  # (N, V), (N,)
    distill = None
    if model.teacher is not None and model.config.distill_weight > 0:
        with torch.no_grad():
            t_logits = model.call(model.teacher, inputs, mask, types).logits  # (B, S, V)
        distill = _kl(pred, t_logits[chosen], model.config.temperature)  # (N,)
    return _lm_sums(pred, targets, distill, model)


def _classification(model: HFModel, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict]:
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    types = batch.get("token_type_ids")
    cfg = model.config
    use_teacher = model.teacher is not None and cfg.distill_weight > 0
    out = model.call(model.net, ids, mask, types, hidden=use_teacher)
    logits = out.logits  # (B, C)
    loss = cfg.task_weight * F.cross_entropy(logits, labels)  # ()
    if use_teacher:
        with torch.no_grad():
            t_out = model.call(model.teacher, ids, mask, types, hidden=True)
        h, t_h = out.hidden_states[-1], t_out.hidden_states[-1]  # (B, S, D) each
        w = mask.to(h.dtype).unsqueeze(-1)  # (B, S, 1)
        mse = (((h - t_h) ** 2) * w).sum() / (w.sum() * h.shape[-1]).clamp_min(1.0)  # ()
        loss = loss + cfg.distill_weight * mse
    with torch.no_grad():
        n = torch.tensor(float(labels.numel()), device=logits.device)
        sums = {
            "count": n,
            "loss_sum": loss.detach() * n,
            "correct": (logits.argmax(-1) == labels).sum().to(logits.dtype),
        }
    return loss, sums


def _embedding(model: HFModel, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict]:
    if model.teacher is None:
        raise ConfigError(
            "model.config.task",
            "'sentence_embedding' distils from the original model: give model.config.path",
        )
    ids, mask = batch["input_ids"], batch["attention_mask"]  # (B, S) each
    types = batch.get("token_type_ids")
    cfg = model.config
    hidden = model(ids, mask, types)  # (B, S, D)
    emb = mean_pool(hidden, mask)  # (B, D)
    table = model.teacher_embeddings
    t_emb = None if table is None else table.lookup(ids, mask, types)  # (B, D) or None
    t_hidden = None
    if t_emb is None or cfg.token_weight > 0:  # not in the table (validation), or per token
        with torch.no_grad():
            t_hidden = model.call(model.teacher, ids, mask, types).last_hidden_state  # (B,S,D)
            t_emb = mean_pool(t_hidden, mask)  # (B, D)
    cos = F.cosine_similarity(emb, t_emb.to(emb.dtype), dim=-1)  # (B,)
    loss = cfg.distill_weight * (1.0 - cos).mean()  # ()
    if cfg.token_weight > 0:
        assert t_hidden is not None
        per = 1.0 - F.cosine_similarity(hidden, t_hidden.to(hidden.dtype), dim=-1)  # (B, S)
        w = mask.to(per.dtype)  # (B, S)
        loss = loss + cfg.token_weight * (per * w).sum() / w.sum().clamp_min(1.0)
    with torch.no_grad():
        n = torch.tensor(float(ids.shape[0]), device=emb.device)
        sums = {"count": n, "loss_sum": loss.detach() * n, "cosine_sum": cos.sum()}
    return loss, sums


_TASK_LOSS = {
    "causal_lm": _causal_lm,
    "masked_lm": _masked_lm,
    "sequence_classification": _classification,
    "sentence_embedding": _embedding,
}


def hf_loss(model: HFModel, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """The objective and metric sums of ``model``'s task on one batch."""
    return _TASK_LOSS[model.config.task](model, batch)
