"""Single sentences for the ``hf_bert`` workload, tokenized by the model's own tokenizer.json.

Every non-blank line is one example (blank lines are skipped). A batch is encoded with the
tokenizer as it comes (its normalizer, WordPiece model and post-processor, so a BERT
``tokenizer.json`` adds ``[CLS]`` / ``[SEP]``), truncated to ``data.max_len`` tokens, and
right-padded to the longest row of the batch (or to ``max_len`` with ``pad_to_max_len``).
The pad id is the tokenizer's configured padding id, else ``[PAD]``, else 0; padded positions
are masked out, so their value never matters.

Batches (contract ``hf_bert``): ``input_ids`` (B, S) long, ``attention_mask`` (B, S) bool,
``token_type_ids`` (B, S) long (the tokenizer's type ids, 0 for a single sentence).

The tokenizer is ``data.tokenizer`` when given, else ``tokenizer.json`` of the model
directory (``model.config.path``): the text is always split as the original model expects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from engine.data.config import DataConfig
from engine.data.source import (
    DataBundle,
    StreamSource,
    line_examples,
    pad_batch,
    train_valid_sources,
)
from engine.data.tokenizer import load_tokenizer

__all__ = ["sentence_tokenizer", "collate_sentences", "build_sentence_data", "nonblank"]


def sentence_tokenizer(path: str | Path, max_len: int) -> tuple[Tokenizer, int]:
    """``(tokenizer, pad id)``: ``path`` loaded, truncating to ``max_len``, not padding."""
    tok = load_tokenizer(path)
    padding = tok.padding
    pad = padding["pad_id"] if padding else tok.token_to_id("[PAD]")
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)
    return tok, int(pad) if pad is not None else 0


def collate_sentences(
    texts: list[str], tok: Tokenizer, pad_id: int, length: int | None
) -> dict[str, Tensor]:
    """Encode and pad one batch of sentences (see the module docstring)."""
    enc = tok.encode_batch(texts)
    ids = pad_batch([e.ids for e in enc], pad_id, length)  # (B, S)
    types = pad_batch([e.type_ids for e in enc], 0, ids.shape[1])  # (B, S)
    lengths = torch.tensor([len(e.ids) for e in enc])  # (B,)
    mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]  # (B, S)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def nonblank(lines: Iterable[tuple[int, str]]) -> Iterator[str]:
    """The text of every non-blank line, without its line terminator."""
    for _, text in lines:
        text = text.rstrip("\r\n")
        if text.strip():
            yield text


def build_sentence_data(
    cfg: DataConfig,
    *,
    batch_size: int,
    seed: int,
    tokenizer: str | Path,
    train_lines: Callable[[], Iterable[tuple[int, str]]],
    valid_lines: Callable[[], Iterable[tuple[int, str]]] | None,
    in_memory: bool,
    valid_parts: Mapping[str, list[tuple[int, str]]] | None = None,
) -> DataBundle:
    """Train / valid sources of single sentences (files streamed, memory listed once);
    ``valid_parts``: the validation lines by source, each also a source of its own
    (``DataBundle.valid_parts``, which the trainer reports a stage's metrics on)."""
    tok, pad_id = sentence_tokenizer(tokenizer, cfg.max_len)
    length = cfg.max_len if cfg.pad_to_max_len else None

    def examples(lines: Callable[[], Iterable[tuple[int, str]]]) -> Callable[[], Any]:
        return lambda: nonblank(lines())

    valid_ex = examples(valid_lines) if valid_lines is not None else None
    kept = line_examples(cfg, examples(train_lines), valid_ex, in_memory)
    counts = kept["counts"]
    collate = lambda ex, _seed: collate_sentences(ex, tok, pad_id, length)  # noqa: E731
    train, valid = train_valid_sources(
        **kept,
        collate=collate,
        batch_size=batch_size,
        seed=seed,
        length=len,  # characters: a proxy of tokens
    )
    info = {
        "tokenizer": str(tokenizer),
        "vocab_size": tok.get_vocab_size(),
        "train_examples": counts[0],
        "valid_examples": counts[1],
    }
    parts = {
        name: StreamSource(
            (lambda rows=rows: list(nonblank(rows))),
            collate,
            batch_size=batch_size,
            seed=seed,
            shuffle_buffer=0,
            name=f"valid:{name}",
            num_examples=len(rows),
            epoch_seeds=False,
        )
        for name, rows in (valid_parts or {}).items()
        if rows
    }
    if parts:
        info["valid_examples_per_source"] = {k: len(v) for k, v in valid_parts.items() if v}
    return DataBundle(train, valid, {}, {}, info, valid_parts=parts)
