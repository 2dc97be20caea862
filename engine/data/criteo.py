"""Criteo click logs (Kaggle / Terabyte TSV) for DLRM, streamed line by line.

Format, one impression per line, 40 tab-separated fields::

    label \t I1 ... I13 \t C1 ... C26

``label`` is 0 or 1; ``I1..I13`` are integer counts (possibly negative, possibly empty);
``C1..C26`` are hashed categorical values as hex strings (up to 16 digits, possibly empty).
Any other line (wrong field count, bad label, non-integer count, bad hex, empty line) raises
:class:`DataError` with file, line and field; nothing is skipped.

Features (registry contract ``dlrm``):

* ``dense`` (B, 13) float32 = ``log1p(max(I, 0))``, a missing count reads as 0;
* ``sparse`` (B, 26) long: table ``t`` has ``num_rows[t]`` hash buckets plus one reserved row
  for "missing", so ``sparse[:, t] = int(C_t, 16) % num_rows[t]`` or ``num_rows[t]`` if empty,
  and the model's ``table_sizes[t] = num_rows[t] + 1``;
* ``labels`` (B,) float32.

A line is checked by one regular expression (fast path); only a failing line is examined field
by field to say what was wrong. A parsed row is packed into one ``array('q')`` of 40 ints
(~370 bytes), so a shuffle buffer of S rows costs about ``S * 0.4`` kB whatever the file size.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from engine.data.config import N_CATEGORICAL, DataConfig
from engine.data.errors import DataError
from engine.data.source import DataBundle, train_valid_sources

__all__ = [
    "N_DENSE",
    "N_FIELDS",
    "parse_criteo",
    "read_criteo",
    "collate_criteo",
    "build_criteo_data",
]

N_DENSE = 13
N_FIELDS = 1 + N_DENSE + N_CATEGORICAL
_INT = re.compile(rb"-?[0-9]+")
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}")
_LINE = re.compile(
    rb"[01]" + rb"\t(?:-?[0-9]+)?" * N_DENSE + rb"\t(?:[0-9a-fA-F]{1,16})?" * N_CATEGORICAL
)


def _show(field: bytes) -> str:
    return repr(field.decode("utf-8", "replace"))


def _diagnose(fields: list[bytes], origin: str | Path, n: int) -> DataError:
    """The error for a line that failed the fast check: the first bad field, by name."""
    if len(fields) != N_FIELDS:
        return DataError(
            origin,
            n,
            f"expected {N_FIELDS} tab-separated fields (label, "
            f"{N_DENSE} integers, {N_CATEGORICAL} hex categories), "
            f"got {len(fields)}",
        )
    if fields[0] not in (b"0", b"1"):
        return DataError(origin, n, f"expected label 0 or 1 in field 1, got {_show(fields[0])}")
    for j in range(1, 1 + N_DENSE):
        if fields[j] and not _INT.fullmatch(fields[j]):
            return DataError(
                origin,
                n,
                f"expected an integer or an empty field in field "
                f"{j + 1} (I{j}), got {_show(fields[j])}",
            )
    for t in range(N_CATEGORICAL):
        v = fields[1 + N_DENSE + t]
        if v and not _HEX.fullmatch(v):
            return DataError(
                origin,
                n,
                f"expected a hex string of 1-16 digits or an empty "
                f"field in field {2 + N_DENSE + t} (C{t + 1}), got "
                f"{_show(v)}",
            )
    return DataError(origin, n, "expected a Criteo TSV line")


def parse_criteo(
    lines: Iterable[tuple[int, bytes]], num_rows: tuple[int, ...], origin: str | Path
) -> Iterator[array]:
    """Rows ``array('q', [label, I1..I13 (missing 0), bucket of C1..C26])`` from raw lines."""
    if len(num_rows) != N_CATEGORICAL:
        raise ValueError(f"num_rows needs {N_CATEGORICAL} entries, got {len(num_rows)}")
    for n, raw in lines:
        line = raw.rstrip(b"\r\n")
        fields = line.split(b"\t")
        if not _LINE.fullmatch(line):
            raise _diagnose(fields, origin, n)
        try:  # a count past 64 bits, or past Python's 4,300 digits (a ValueError)
            vals = [int(x) if x else 0 for x in fields[: 1 + N_DENSE]]
            vals += [
                int(x, 16) % r if x else r
                for x, r in zip(fields[1 + N_DENSE :], num_rows, strict=True)
            ]
            row = array("q", vals)
        except (OverflowError, ValueError):
            raise DataError(origin, n, "expected integer counts within 64 bits") from None
        yield row


def read_criteo(path: str | Path, num_rows: tuple[int, ...]) -> Iterator[array]:
    """Parsed rows of a Criteo TSV file, streamed in file order."""
    with open(path, "rb") as f:
        yield from parse_criteo(enumerate(f, 1), num_rows, path)


def collate_criteo(rows: list[array]) -> dict[str, Tensor]:
    """Stack parsed rows into ``dense`` (B, 13), ``sparse`` (B, 26), ``labels`` (B,)."""
    a = np.frombuffer(b"".join(rows), dtype=np.int64).reshape(len(rows), N_FIELDS)  # (B, 40)
    counts = np.maximum(a[:, 1 : 1 + N_DENSE], 0).astype(np.float64)  # (B, 13)
    return {
        "dense": torch.from_numpy(np.log1p(counts).astype(np.float32)),  # (B, 13)
        "sparse": torch.from_numpy(a[:, 1 + N_DENSE :].copy()),  # (B, 26)
        "labels": torch.from_numpy(a[:, 0].astype(np.float32)),  # (B,)
    }


def dlrm_overrides(num_rows: tuple[int, ...]) -> dict[str, object]:
    return {"n_dense": N_DENSE, "table_sizes": [r + 1 for r in num_rows]}


def build_criteo_data(cfg: DataConfig, *, batch_size: int, seed: int) -> DataBundle:
    """Streaming train / valid sources over ``cfg.train`` (and ``cfg.valid``)."""
    rows = cfg.table_rows()
    train_path, valid_path = cfg.train, cfg.valid
    assert train_path is not None
    valid_ex = None if valid_path is None else (lambda: read_criteo(valid_path, rows))
    train, valid = train_valid_sources(
        lambda: read_criteo(train_path, rows),
        valid_ex,
        collate=lambda ex, _seed: collate_criteo(ex),
        batch_size=batch_size,
        seed=seed,
        shuffle_buffer=cfg.shuffle_buffer,
        drop_last=cfg.drop_last,
        valid_every=cfg.valid_every,
        length_buckets=cfg.length_buckets,  # refused: rows have no length
    )
    info = {
        "missing_row": "index num_rows[t] of each table",
        "num_rows": list(rows),
        "train_examples": None,
        "valid_examples": None,
    }
    return DataBundle(train, valid, dlrm_overrides(rows), {}, info)
