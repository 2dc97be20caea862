"""The teacher's sentence embeddings of the training split, computed once per job.

With ``distill="cosine_embedding"`` the frozen teacher enters a training step only through the
pooled embedding of each sentence. It is a fixed function of the sentence, so
:class:`TeacherEmbeddings` computes it once for every training sentence before the first step
and :func:`engine.models.hf_bert.distill.distill_loss` looks it up instead of running the
teacher: on MiniLM (batch 32, length buckets) the teacher's forward is ~45% of a step's
forward and backward.

* **Key.** A sentence is its attended ``input_ids`` and ``token_type_ids`` (padding dropped),
  so any batching or padding of the same sentence finds the same row. A batch with a sentence
  that is not in the table (validation, a sentence the build did not see) runs the teacher on
  the whole batch, as without a table.
* **Deterministic.** The table is built the same way whether the job starts fresh or resumes
  (the training split's epoch-0 stream, regrouped by length), so a resumed run looks up the
  same values bitwise.
* **Bounded.** :func:`should_build` builds it only when the job will see the training split at
  least :data:`MIN_PASSES` times (the teacher then runs once per sentence of the split instead
  of once per planned example) and the table stays within :data:`MAX_BYTES`; a split found
  larger while building is abandoned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from engine.models.hf_bert.batches import by_length
from engine.models.hf_bert.pooling import mean_pool

__all__ = [
    "TeacherEmbeddings",
    "attach_teacher_embeddings_",
    "should_build",
    "max_rows",
    "sentence_keys",
    "MAX_BYTES",
    "MIN_PASSES",
]

MAX_BYTES = 256 * 2**20  # the table's float32 rows
MIN_PASSES = 1.25  # planned examples / split size: the teacher runs on the split once, not on
# every planned example, so the table pays above one pass (the margin: its grouping and lookups)


def should_build(step_examples: int, epochs: float, split: int | None, dim: int) -> bool:
    """Whether a table pays for its teacher pass: the job plans ``step_examples`` training
    examples in step-counted stages and ``epochs`` passes in epoch-counted ones over a split of
    ``split`` sentences (``None``: unknown; the build then stops at :func:`max_rows`)."""
    if split is None:
        return epochs >= MIN_PASSES
    if split <= 0 or split > max_rows(dim):
        return False
    return epochs + step_examples / split >= MIN_PASSES


def max_rows(dim: int) -> int:
    """The most sentences a table of width ``dim`` holds within :data:`MAX_BYTES`."""
    return MAX_BYTES // (4 * max(dim, 1))


def sentence_keys(ids: Tensor, mask: Tensor, types: Tensor | None) -> list[bytes]:
    """One key per row of ``ids (B, S)``: its attended ids and token types, as bytes."""
    keep = mask.to(torch.bool).cpu()  # (B, S)
    rows = ids.cpu().to(torch.int64)  # (B, S)
    kinds = None if types is None else types.cpu().to(torch.int64)  # (B, S)
    keys = []
    for i in range(rows.shape[0]):
        key = rows[i][keep[i]].numpy().tobytes()
        if kinds is not None:
            key += b"|" + kinds[i][keep[i]].numpy().tobytes()
        keys.append(key)
    return keys


def _row(ids: Tensor, mask: Tensor, types: Tensor | None, i: int, n: int) -> tuple:
    """Row ``i`` of a batch, its first ``n`` (attended) positions, as a batch of one."""
    return (
        ids[i : i + 1, :n].clone(),
        mask[i : i + 1, :n].clone(),
        None if types is None else types[i : i + 1, :n].clone(),
    )


class TeacherEmbeddings:
    """``{sentence key: row}`` over a ``(N, D)`` table of teacher embeddings (the
    teacher's dtype; :func:`~engine.models.hf_bert.distill.distill_loss` casts to the student's)."""

    def __init__(self, index: dict[bytes, int], table: Tensor) -> None:
        self.index = index
        self.table = table  # (N, D)

    def __len__(self) -> int:
        return len(self.index)

    @classmethod
    @torch.no_grad()
    def build(
        cls,
        teacher: nn.Module,
        batches: Iterable[Mapping[str, Tensor]],
        *,
        device: torch.device,
        max_rows: int,
        group: int = 32,
        embed: Callable[[Tensor, Tensor, Tensor | None], Tensor] | None = None,
    ) -> TeacherEmbeddings | None:
        """The table of every sentence of ``batches`` (``None`` past ``max_rows``), the
        teacher run on groups of ``group`` sentences of similar length; ``embed(ids, mask,
        types) -> (B, D)`` runs it (default: the mean-pooled ``teacher(ids, mask, types)``)."""
        if embed is None:
            embed = lambda ids, mask, types: mean_pool(teacher(ids, mask, types), mask)  # noqa: E731
        rows: dict[bytes, tuple[Tensor, Tensor, Tensor | None]] = {}
        for batch in batches:
            ids, mask = batch["input_ids"], batch["attention_mask"]  # (B, S) each
            types = batch.get("token_type_ids")
            lengths = mask.sum(1).tolist()  # right padding: a row's first n positions
            for i, key in enumerate(sentence_keys(ids, mask, types)):
                if key not in rows:
                    rows[key] = _row(ids, mask, types, i, int(lengths[i]))
            if len(rows) > max_rows:
                return None
        if not rows:
            return None
        teacher_was_training = teacher.training
        teacher.eval()
        index: dict[bytes, int] = {}
        parts: list[Tensor] = []
        singles = [
            (i.to(device), m.to(device), None if t is None else t.to(device))
            for i, m, t in rows.values()
        ]
        for ids, mask, types in by_length(singles, group):
            emb = embed(ids, mask, types)  # (b, D)
            for j, key in enumerate(sentence_keys(ids, mask, types)):
                index[key] = len(index)
                parts.append(emb[j])
        teacher.train(teacher_was_training)
        return cls(index, torch.stack(parts))  # (N, D)

    def lookup(self, ids: Tensor, mask: Tensor, types: Tensor | None) -> Tensor | None:
        """The ``(B, D)`` teacher embeddings of a batch, or ``None`` if any row is missing
        (or a CUDA graph is being captured: the lookup reads the ids on the host)."""
        if ids.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        rows = []
        for key in sentence_keys(ids, mask, types):
            row = self.index.get(key)
            if row is None:
                return None
            rows.append(row)
        table = self.table if self.table.device == ids.device else self.table.to(ids.device)
        self.table = table
        return table[torch.tensor(rows, device=ids.device)]  # (B, D)


def attach_teacher_embeddings_(
    model: nn.Module,
    train: Any,
    schedule: Sequence[Any],
    batch_size: int,
    *,
    device: torch.device,
) -> dict[str, Any] | None:
    """Build and attach the table of ``train`` (a training source) when ``model``'s loss reads
    the teacher only through its pooled embedding (``model.cached_distillation()`` gives its
    width and how to compute it) and the job's ``schedule`` passes over the split often
    enough; returns what was done (``None``: not such a distillation)."""
    spec = model.cached_distillation()
    if spec is None:
        return None
    dim, embed = spec
    step_examples = sum(s.step_limit or 0 for s in schedule) * batch_size
    epochs = float(sum(s.epochs or 0 for s in schedule))
    split = train.num_examples()
    if not should_build(step_examples, epochs, split, dim):
        model.set_teacher_embeddings(None)
        why = (
            f"the job passes over the training split fewer than {MIN_PASSES:g} times, or "
            f"the split has more than {max_rows(dim)} sentences"
        )
        return {"teacher_embeddings": 0, "reason": why}
    t0 = time.perf_counter()
    table = TeacherEmbeddings.build(
        model.teacher, train.batches(0), device=device, max_rows=max_rows(dim), embed=embed
    )
    model.set_teacher_embeddings(table)
    return {
        "teacher_embeddings": 0 if table is None else len(table),
        "seconds": round(time.perf_counter() - t0, 3),
    }
