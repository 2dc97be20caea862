"""Masked-language-model pre-training from plain text lines (one sentence or passage a line).

Sequences. Each non-blank line is WordPiece-tokenized (no special tokens, no truncation); a
blank line ends a document. With ``mlm_pack`` (default) consecutive lines of a document are
packed greedily into ``[CLS] l1 [SEP] l2 [SEP] ... [SEP]`` of at most ``max_len`` tokens; a line
longer than ``L = max_len - 2`` tokens is cut into chunks of ``L`` (no token is dropped).
Without packing every line is one sequence ``[CLS] line[:L] [SEP]`` (truncated). A line that
is not blank but yields no token raises :class:`DataError`. The ``valid_every`` split counts
packed sequences; the tokenizer is trained on every line of the training file.

Masking (BERT): each real, non-special token is selected with probability ``p =
mlm_probability``; a sequence with no selected token gets one chosen uniformly (so every
sequence contributes to the loss); a selected token becomes ``[MASK]`` with probability 0.8, a
uniformly random non-special token with 0.1, and stays with 0.1. ``labels`` hold the original
id at selected positions and -100 elsewhere. All draws come from a ``torch.Generator`` seeded
by the batch seed ``(seed, split, epoch, batch index)``, so masks replay exactly on resume and
differ between epochs; validation uses the same masks every epoch.

Batches (contract ``mlm``): ``input_ids`` (B, S) long, ``attention_mask`` (B, S) bool,
``labels`` (B, S) long, S the longest sequence of the batch (or ``max_len``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from engine.data.config import DataConfig
from engine.data.errors import DataError
from engine.data.source import (
    DataBundle,
    line_examples,
    pad_batch,
    read_lines,
    train_valid_sources,
)
from engine.data.tokenizer import SpecialIds, obtain_tokenizer, special_ids

__all__ = ["pack_lines", "mask_tokens", "collate_mlm", "build_mlm_data", "IGNORE_INDEX"]

IGNORE_INDEX = -100


def pack_lines(
    lines: Iterable[tuple[int, str]],
    tok: Tokenizer,
    special: SpecialIds,
    *,
    max_len: int,
    pack: bool,
    origin: str | Path,
) -> Iterator[list[int]]:
    """Token id sequences (with [CLS] / [SEP]) from ``(line number, text)`` pairs, streamed."""
    cap = max_len - 2
    cur: list[int] = []

    def wrap(ids: list[int]) -> list[int]:
        return [special.cls, *ids, special.sep]

    for n, text in lines:
        if not text.strip():
            if cur:
                yield wrap(cur)
                cur = []
            continue
        ids = tok.encode(text.rstrip("\r\n"), add_special_tokens=False).ids
        if not ids:
            raise DataError(origin, n, "expected text with at least one token, got none")
        if not pack:
            yield wrap(ids[:cap])
            continue
        while len(ids) > cap:
            if cur:
                yield wrap(cur)
                cur = []
            yield wrap(ids[:cap])
            ids = ids[cap:]
        if cur and len(cur) + 1 + len(ids) > cap:
            yield wrap(cur)
            cur = []
        cur = [*cur, special.sep, *ids] if cur else list(ids)
    if cur:
        yield wrap(cur)


def mask_tokens(
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    special: SpecialIds,
    replacements: Tensor,
    probability: float,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """``(masked input_ids, labels)`` for ``input_ids`` (B, S); see the module docstring."""
    b, s = input_ids.shape
    specials = torch.tensor(special.all())
    eligible = attention_mask & ~torch.isin(input_ids, specials)  # (B, S)
    chosen = eligible & (torch.rand((b, s), generator=generator) < probability)  # (B, S)
    scores = torch.rand((b, s), generator=generator) * eligible  # (B, S) zero where ineligible
    empty = ~chosen.any(1) & eligible.any(1)  # (B,)
    force = torch.zeros_like(chosen)
    force[torch.arange(b), scores.argmax(1)] = True  # (B, S) one eligible position per row
    chosen |= force & empty[:, None]  # (B, S)
    labels = torch.where(chosen, input_ids, IGNORE_INDEX)  # (B, S)
    action = torch.rand((b, s), generator=generator)  # (B, S)
    pick = torch.randint(len(replacements), (b, s), generator=generator)  # (B, S)
    out = input_ids.clone()  # (B, S)
    out[chosen & (action < 0.8)] = special.mask
    rand = chosen & (action >= 0.8) & (action < 0.9)  # (B, S)
    out[rand] = replacements[pick][rand]
    return out, labels


def collate_mlm(
    seqs: list[list[int]],
    batch_seed: int,
    *,
    special: SpecialIds,
    replacements: Tensor,
    probability: float,
    length: int | None,
) -> dict[str, Tensor]:
    """Pad and mask a batch of sequences with the batch's own generator."""
    ids = pad_batch(seqs, special.pad, length)  # (B, S)
    lengths = torch.tensor([len(x) for x in seqs])  # (B,)
    attention_mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]  # (B, S)
    gen = torch.Generator().manual_seed(batch_seed)
    input_ids, labels = mask_tokens(
        ids,
        attention_mask,
        special=special,
        replacements=replacements,
        probability=probability,
        generator=gen,
    )
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def read_text(path: str | Path) -> Iterator[tuple[int, str]]:
    return read_lines(path)


def build_mlm_data(
    cfg: DataConfig,
    *,
    batch_size: int,
    seed: int,
    workdir: str | Path | None,
    train_lines: Callable[[], Iterable[tuple[int, str]]],
    valid_lines: Callable[[], Iterable[tuple[int, str]]] | None,
    names: tuple[str, str],
    in_memory: bool,
) -> DataBundle:
    """Tokenizer and masked-LM sources over text lines (files streamed, memory packed once)."""
    tok, tok_path, origin = obtain_tokenizer(
        given=cfg.tokenizer,
        workdir=workdir,
        texts=lambda: (t for _, t in train_lines()),
        vocab_size=cfg.vocab_size,
        lowercase=cfg.lowercase,
    )
    special = special_ids(tok, tok_path or "<trained tokenizer>")
    tok.no_truncation()
    tok.no_padding()
    vocab = tok.get_vocab_size()
    replacements = torch.tensor([i for i in range(vocab) if i not in special.all()])
    if len(replacements) == 0:
        raise DataError(tok_path or "<trained tokenizer>", None, "expected ordinary tokens")

    def seqs(lines: Callable[[], Iterable[tuple[int, str]]], name: str) -> Callable[[], Any]:
        def run() -> Iterator[list[int]]:
            return pack_lines(
                lines(), tok, special, max_len=cfg.max_len, pack=cfg.mlm_pack, origin=name
            )

        return run

    length = cfg.max_len if cfg.pad_to_max_len else None

    def collate(ex: list[list[int]], batch_seed: int) -> dict[str, Tensor]:
        return collate_mlm(
            ex,
            batch_seed,
            special=special,
            replacements=replacements,
            probability=cfg.mlm_probability,
            length=length,
        )

    valid_seqs = seqs(valid_lines, names[1]) if valid_lines is not None else None
    examples = line_examples(cfg, seqs(train_lines, names[0]), valid_seqs, in_memory)
    counts = examples["counts"]
    train, valid = train_valid_sources(
        **examples,
        collate=collate,
        batch_size=batch_size,
        seed=seed,
        length=len,  # tokens of a (packed) sequence
    )
    artifacts = {"tokenizer": tok_path} if tok_path else {}
    info = {
        "tokenizer": origin,
        "vocab_size": vocab,
        "train_examples": counts[0],
        "valid_examples": counts[1],
    }
    return DataBundle(train, valid, {"vocab_size": vocab, "max_len": cfg.max_len}, artifacts, info)
