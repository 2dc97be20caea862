"""Sentence(-pair) classification from JSONL or CSV, tokenized with WordPiece.

Input rows. **JSONL**: one JSON object per line with string fields ``text_a`` (and ``text_b``
unless it is null) and a label field holding a string or an integer. **CSV**: a header line
naming the columns (any order, extra columns ignored), then one record per row (RFC 4180
quoting; a quoted field may span lines, errors report the record's first line). Every row is
either used or reported: an empty line, bad JSON (a number past Python's 4,300 digits or
nesting deeper than the parser's recursion limit included), a missing key, a non-string text,
a wrong field count or a label outside ``data.labels`` raises :class:`DataError` with file
and line.

Labels: ``data.labels`` lists the class names in id order. If absent they are inferred in the
first pass over the training file (the tokenizer pass, or a label-only pass when the tokenizer
is given): the distinct labels sorted numerically if all are integers, else as strings; they
are saved to ``workdir/labels.json`` and reused from there, like the tokenizer.

Batches (registry contract ``transformer``): ``input_ids`` (B, S) long built as
``[CLS] a [SEP] b [SEP]`` with longest-first truncation to ``max_len``, ``token_type_ids``
(B, S) long (0 for a, 1 for b, 0 on padding), ``attention_mask`` (B, S) bool, ``labels`` (B,)
long; S is the longest row of the batch (``pad_to_max_len``: always ``max_len``). Files are
re-read and re-tokenized every epoch (streaming); in-memory rows are tokenized once.
"""

from __future__ import annotations

import csv
import json
import os
import reprlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from engine.data.config import DataConfig
from engine.data.errors import DataError
from engine.data.source import DataBundle, pad_batch, read_lines, split_counts, train_valid_sources
from engine.data.tokenizer import obtain_tokenizer, prepare

__all__ = [
    "read_jsonl_pairs",
    "read_csv_pairs",
    "read_pairs",
    "collate_pairs",
    "build_pair_data",
    "LABELS_FILE",
    "PairRow",
]

LABELS_FILE = "labels.json"
PairRow = tuple[int, str, str | None, str]  # (line, text_a, text_b or None, label)
PairExample = tuple[list[int], list[int], int]  # (ids, type_ids, label id)


def _show(value: Any) -> str:
    """``repr`` of a value from the file, cut short (nesting, long lists and strings)."""
    return reprlib.repr(value)


def _label_text(path: str | Path, line: int, key: str, v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, str | int) or v == "":
        raise DataError(
            path, line, f"expected a non-empty string or integer label in {key!r}, got {_show(v)}"
        )
    return str(v)


def read_jsonl_pairs(
    path: str | Path, text_a: str, text_b: str | None, label_field: str
) -> Iterator[PairRow]:
    """Rows of a JSONL file, streamed (see the module docstring for the format)."""
    keys = [k for k in (text_a, text_b) if k is not None]
    for n, line in read_lines(path):
        if not line.strip():
            raise DataError(path, n, "expected a JSON object, got an empty line")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                path, n, f"expected a JSON object ({e.msg} at column {e.colno})"
            ) from None
        except (ValueError, RecursionError) as e:  # a 5,000-digit number; deep nesting
            reason = "nested too deeply to parse" if isinstance(e, RecursionError) else str(e)
            raise DataError(path, n, f"expected a JSON object ({reason})") from None
        if not isinstance(obj, dict):
            raise DataError(path, n, f"expected a JSON object, got {type(obj).__name__}")
        for k in (*keys, label_field):
            if k not in obj:
                raise DataError(path, n, f"expected key {k!r}; the object has {_show(sorted(obj))}")
        for k in keys:
            if not isinstance(obj[k], str):
                raise DataError(path, n, f"expected a string in {k!r}, got {_show(obj[k])}")
        b = obj[text_b] if text_b is not None else None
        yield n, obj[text_a], b, _label_text(path, n, label_field, obj[label_field])


def _csv_lines(path: str | Path) -> Iterator[str]:
    for _, line in read_lines(path):
        yield line


def read_csv_pairs(
    path: str | Path, text_a: str, text_b: str | None, label_field: str
) -> Iterator[PairRow]:
    """Rows of a CSV file with a header line, streamed."""
    reader = csv.reader(_csv_lines(path), strict=True)
    start = 1
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(path, 1, "expected a header line, got an empty file")
        cols = {}
        for k in [k for k in (text_a, text_b, label_field) if k is not None]:
            if k not in header:
                raise DataError(
                    path, 1, f"expected a header with column {k!r}, got {_show(header)}"
                )
            cols[k] = header.index(k)
        ia, il = cols[text_a], cols[label_field]
        ib = cols[text_b] if text_b is not None else None
        width = len(header)
        start = reader.line_num + 1
        for row in reader:
            if len(row) != width:
                raise DataError(
                    path,
                    start,
                    f"expected {width} comma-separated fields "
                    f"({', '.join(header)}), got {len(row)}",
                )
            b = row[ib] if ib is not None else None
            yield start, row[ia], b, _label_text(path, start, label_field, row[il])
            start = reader.line_num + 1
    except csv.Error as e:
        raise DataError(path, start, f"expected a well-formed CSV record ({e})") from None


def read_pairs(path: str | Path, fmt: str, cfg: DataConfig) -> Iterator[PairRow]:
    reader = read_jsonl_pairs if fmt == "jsonl" else read_csv_pairs
    return reader(path, cfg.text_a, cfg.text_b, cfg.label_field)


def collate_pairs(
    examples: list[PairExample], pad_id: int, length: int | None
) -> dict[str, Tensor]:
    """Pad a batch of encoded rows (to ``length``, default the longest row)."""
    input_ids = pad_batch([e[0] for e in examples], pad_id, length)  # (B, S)
    token_type_ids = pad_batch([e[1] for e in examples], 0, input_ids.shape[1])  # (B, S)
    lengths = torch.tensor([len(e[0]) for e in examples])  # (B,)
    attention_mask = torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]  # (B, S)
    labels = torch.tensor([e[2] for e in examples], dtype=torch.long)  # (B,)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "labels": labels,
    }


def _sorted_labels(found: set[str]) -> tuple[str, ...]:
    try:
        return tuple(sorted(found, key=int))
    except ValueError:
        return tuple(sorted(found))


def _saved_labels(workdir: str | Path | None) -> tuple[tuple[str, ...] | None, str | None]:
    if workdir is None:
        return None, None
    path = Path(workdir) / LABELS_FILE
    if not path.exists():
        return None, None
    try:
        labels = json.loads(path.read_text())["labels"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise DataError(path, None, 'expected {"labels": [names]}') from None
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
        raise DataError(path, None, f"expected a non-empty list of label names, got {labels!r}")
    return tuple(labels), str(path)


def _save_labels(workdir: str | Path | None, labels: tuple[str, ...]) -> str | None:
    if workdir is None:
        return None
    path = Path(workdir) / LABELS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"labels": list(labels)}))
    os.replace(tmp, path)
    return str(path)


def _encoder(tok: Tokenizer, labels: tuple[str, ...]) -> Callable[..., Iterator[PairExample]]:
    index = {name: i for i, name in enumerate(labels)}

    def encode(rows: Iterable[PairRow], origin: str) -> Iterator[PairExample]:
        for line, a, b, label in rows:
            y = index.get(label)
            if y is None:
                raise DataError(origin, line, f"expected a label in {list(labels)}, got {label!r}")
            e = tok.encode(a, b)
            yield e.ids, e.type_ids, y

    return encode


def build_pair_data(
    cfg: DataConfig,
    *,
    batch_size: int,
    seed: int,
    workdir: str | Path | None,
    train_rows: Callable[[], Iterable[PairRow]],
    valid_rows: Callable[[], Iterable[PairRow]] | None,
    names: tuple[str, str],
    in_memory: bool,
) -> DataBundle:
    """Tokenizer, labels and sources for rows from files (streamed) or memory (encoded once).

    ``train_rows()`` / ``valid_rows()`` re-read their rows on every call; ``names`` are the
    origins reported in errors (the file paths).
    """
    every = cfg.valid_every
    labels, labels_path = cfg.labels, None
    if labels is None:
        labels, labels_path = _saved_labels(workdir)
    seen: set[str] = set()
    total = [0]

    def scan() -> Iterator[str]:  # one pass: counts, labels, texts of the training split
        for i, (_, a, b, label) in enumerate(train_rows()):
            total[0] = i + 1
            seen.add(label)
            if not every or i % every != every - 1:
                yield a
                if b is not None:
                    yield b

    tok, tok_path, origin = obtain_tokenizer(
        given=cfg.tokenizer,
        workdir=workdir,
        texts=scan,
        vocab_size=cfg.vocab_size,
        lowercase=cfg.lowercase,
    )
    scanned = origin == "trained"
    if labels is None:
        if not scanned:
            for _ in scan():
                pass
            scanned = True
        if not seen:
            raise DataError(names[0], None, "expected at least one row to infer the labels from")
        labels = _sorted_labels(seen)
        labels_path = _save_labels(workdir, labels)
    special = prepare(tok, cfg.max_len, tok_path or "<trained tokenizer>")
    encode = _encoder(tok, labels)
    counts: tuple[int | None, int | None] = (None, None)
    if scanned:
        counts = split_counts(total[0], every) if every else (total[0], None)

    def rows_fn(rows: Callable[[], Iterable[PairRow]], name: str) -> Callable[[], Iterable[Any]]:
        if in_memory:
            cached = list(encode(rows(), name))
            return lambda: cached
        return lambda: encode(rows(), name)

    train_ex = rows_fn(train_rows, names[0])
    valid_ex = rows_fn(valid_rows, names[1]) if valid_rows is not None else None
    if in_memory:
        counts = (len(train_ex()), len(valid_ex()) if valid_ex is not None else None)
    length = cfg.max_len if cfg.pad_to_max_len else None
    train, valid = train_valid_sources(
        train_ex,
        valid_ex,
        collate=lambda ex, _seed: collate_pairs(ex, special.pad, length),
        batch_size=batch_size,
        seed=seed,
        drop_last=cfg.drop_last,
        valid_every=every,
        shuffle_buffer=(
            len(train_ex()) if cfg.shuffle_buffer and in_memory else cfg.shuffle_buffer
        ),
        counts=counts,
        length_buckets=cfg.length_buckets,
        length=lambda e: len(e[0]),  # tokens of the pair
    )
    artifacts = {k: v for k, v in (("tokenizer", tok_path), ("labels", labels_path)) if v}
    info = {
        "labels": list(labels),
        "tokenizer": origin,
        "vocab_size": tok.get_vocab_size(),
        "train_examples": train.num_examples(),
        "valid_examples": valid.num_examples() if valid is not None else None,
    }
    overrides = {
        "vocab_size": tok.get_vocab_size(),
        "num_classes": len(labels),
        "max_len": cfg.max_len,
    }
    return DataBundle(train, valid, overrides, artifacts, info)
