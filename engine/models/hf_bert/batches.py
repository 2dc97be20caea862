"""Calibration sentences as ``(input_ids, attention_mask, token_type_ids)`` batches (a leaf).

:func:`take_sentences` cuts the first sentences off a stream of training batches and
:func:`by_length` regroups sentences by length, re-padded, so that no time goes to padded
positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["Batch", "CALIBRATION_BATCH", "take_sentences", "by_length", "as_dicts"]

Batch = tuple[Tensor, Tensor, Tensor | None]  # input_ids (B, S), attention_mask (B, S), types
CALIBRATION_BATCH = 32  # sentences per regrouped calibration batch


def take_sentences(
    batches: Iterable[Mapping[str, Tensor]], first: int, then: int, device: torch.device
) -> tuple[list[Batch], list[Batch]]:
    """The first ``first`` sentences of ``batches`` and the ``then`` that follow, as
    ``(input_ids, attention_mask, token_type_ids)`` batches on ``device``."""
    out: tuple[list[Batch], list[Batch]] = ([], [])
    wanted = (first, then)
    part, count = 0, 0
    for batch in batches:
        if part >= 2 or wanted[part] == 0:
            break
        start, n = 0, int(batch["input_ids"].shape[0])
        types = batch.get("token_type_ids")
        while start < n and part < 2 and wanted[part] > 0:
            take = min(n - start, wanted[part] - count)
            rows = slice(start, start + take)
            out[part].append(
                (
                    batch["input_ids"][rows].to(device),
                    batch["attention_mask"][rows].to(device),
                    None if types is None else types[rows].to(device),
                )
            )
            start, count = start + take, count + take
            if count >= wanted[part]:
                part, count = part + 1, 0
    return out


def by_length(batches: Sequence[Batch], size: int = CALIBRATION_BATCH) -> list[Batch]:
    """The same sentences, sorted by length and re-padded in groups of ``size`` (right
    padding: the attended positions of each row are its first ones, as the collate makes
    them; padded positions hold 0 and are masked)."""
    rows = []
    for ids, mask, types in batches:
        lengths = mask.sum(1).tolist()
        for i, n in enumerate(lengths):
            rows.append((int(n), ids[i], mask[i], None if types is None else types[i]))
    rows.sort(key=lambda r: r[0])
    out = []
    for start in range(0, len(rows), size):
        group = rows[start : start + size]
        width = max(max(r[0] for r in group), 1)
        ids = group[0][1].new_zeros(len(group), width)  # (B, S') padded with 0: masked out
        mask = group[0][2].new_zeros(len(group), width)  # (B, S')
        types = None if group[0][3] is None else ids.clone()  # (B, S')
        for i, (n, row_ids, row_mask, row_types) in enumerate(group):
            ids[i, :n], mask[i, :n] = row_ids[:n], row_mask[:n]
            if types is not None:
                types[i, :n] = row_types[:n]
        out.append((ids, mask, types))
    return out


def as_dicts(batches: Sequence[Batch]) -> list[dict[str, Tensor]]:
    return [{"input_ids": i, "attention_mask": m, "token_type_ids": t} for i, m, t in batches]
