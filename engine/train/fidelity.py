"""Fidelity of an exported ``hf_bert`` student to its teacher, measured on the saved file.

:func:`measure_fidelity` reloads the export (``engine.export.load_compressed``) and compares
its mean-pooled sentence embeddings with the original model's (the trainer's frozen teacher)
on the held-out sentences: one cosine per sentence; the result holds their mean, minimum and
count. It measures what a user downloads, not the in-memory model the last validation saw.

:func:`engine.train.cli.run_job` calls it on rank 0 after the export, so a job trained in one
process, in several under torchrun or across machines under Ray Train reports the same figure
in its ``report.json`` (``fidelity``; ``None`` for every other architecture).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.export import load_compressed
from engine.models.hf_bert import mean_pool

__all__ = ["measure_fidelity"]


@torch.no_grad()
def measure_fidelity(trainer: Any, export_dir: Path) -> dict[str, Any] | None:
    """``hf_bert``: cosine of the exported model's sentence embeddings with the original's on
    the held-out sentences (at most ``training.eval_batches`` batches); None otherwise.

    ``trainer``: the :class:`~engine.train.trainer.Trainer` that trained the export (its
    ``model.teacher``, ``data.valid``, ``device`` and ``job``)."""
    teacher = getattr(trainer.model, "teacher", None)
    valid = trainer.data.valid
    if trainer.job.model.arch != "hf_bert" or teacher is None or valid is None:
        return None
    student, _ = load_compressed(export_dir, device=trainer.device)
    # the teacher is in eval mode for good: set_teacher puts it there, and it is not a
    # submodule, so the trainer's model.train() never reaches it
    limit, cosines = trainer.job.training.eval_batches, []
    for i, batch in enumerate(valid.batches(0)):
        if limit is not None and i >= limit:
            break
        b = {k: v.to(trainer.device) for k, v in batch.items()}
        ids, mask, types = b["input_ids"], b["attention_mask"], b.get("token_type_ids")
        got = mean_pool(student(ids, mask, types), mask)  # (B, D)
        want = mean_pool(teacher(ids, mask, types), mask)  # (B, D)
        cosines.append(F.cosine_similarity(got, want, dim=-1).double().cpu())  # (B,)
    if not cosines:
        return None
    cos = torch.cat(cosines)  # (N,)
    return {
        "metric": "cosine",
        "mean": float(cos.mean()),
        "min": float(cos.min()),
        "sentences": int(cos.numel()),
        "split": "valid",
        "measured_on": "export",
    }
