"""Arrays for an MLP from an NPZ file: ``x`` (N, F) or (N, ...) features, ``y`` (N,) labels.

The archive is read member by member without unpickling anything (the safety of
``np.load(..., allow_pickle=False)``): each ``.npy`` header is parsed with
``numpy.lib.format`` and an object dtype is refused. Rows are streamed in chunks of about
1 MiB from the (stored or deflated) zip members, so a file larger than memory trains; a
Fortran-ordered member (``np.savez(path, x=a.T)``) cannot be streamed by rows and is read whole
with ``read_array(allow_pickle=False)``.

Checks (each a :class:`DataError` naming the file and, for a row, its 0-based index): both
members present; ``x`` real-valued (bool / int / float, cast to float32) with at least one
dimension and finite values; ``y`` a 1-D integer array of the same length with labels >= 0.
``x`` rows are flattened to ``F = prod(shape[1:])`` features (1 for a 1-D ``x``). The number of
classes is ``max(y) + 1`` over the training and validation labels (one cheap pass over ``y``).

Batches (contract ``mlp``): ``x`` (B, F) float32, ``labels`` (B,) long.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import Tensor

from engine.data.config import DataConfig
from engine.data.errors import DataError
from engine.data.source import DataBundle, split_counts, train_valid_sources

__all__ = ["NpyHeader", "npz_headers", "read_npz", "label_range", "collate_arrays",
           "build_array_data", "build_npz_data"]  # fmt: skip

CHUNK_BYTES = 1 << 20
ArrayExample = tuple[np.ndarray, int]  # (x row (F,) float32, label)


@dataclass(frozen=True)
class NpyHeader:
    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype

    @property
    def features(self) -> int:
        return math.prod(self.shape[1:])


def _read_header(f: IO[bytes], path: str | Path, member: str) -> NpyHeader:
    try:
        major, _ = np.lib.format.read_magic(f)
        read = (np.lib.format.read_array_header_1_0 if major == 1
                else np.lib.format.read_array_header_2_0)  # fmt: skip
        shape, fortran, dtype = read(f)
    except ValueError as e:
        raise DataError(path, None, f"{member}: expected a .npy array ({e})") from None
    if dtype.hasobject:
        raise DataError(path, None, f"{member}: expected a numeric array, got dtype {dtype}; "
                                    "object (pickled) arrays are refused")  # fmt: skip
    return NpyHeader(tuple(shape), bool(fortran), dtype)


def npz_headers(path: str | Path) -> tuple[NpyHeader, NpyHeader]:
    """Validated headers of ``x`` and ``y`` (nothing else is read)."""
    with _open_zip(path) as zf, zf.open("x.npy") as fx, zf.open("y.npy") as fy:
        hx, hy = _read_header(fx, path, "x"), _read_header(fy, path, "y")
    if hx.dtype.kind not in "biuf" or not hx.shape:
        raise DataError(path, None, f"x: expected a real array of shape (N, ...), got dtype "
                                    f"{hx.dtype} and shape {hx.shape}")  # fmt: skip
    if hy.dtype.kind not in "iu" or len(hy.shape) != 1:
        raise DataError(path, None, f"y: expected 1-D integer labels, got dtype {hy.dtype} "
                                    f"and shape {hy.shape}")  # fmt: skip
    if hy.shape[0] != hx.shape[0]:
        raise DataError(path, None, f"expected as many labels as rows, got x with "
                                    f"{hx.shape[0]} rows and y with {hy.shape[0]}")  # fmt: skip
    return hx, hy


def _open_zip(path: str | Path) -> zipfile.ZipFile:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(path, None, f"expected an .npz archive ({e})") from None
    names = set(zf.namelist())
    if not {"x.npy", "y.npy"} <= names:
        zf.close()
        raise DataError(path, None, f"expected arrays 'x' and 'y', got "
                                    f"{sorted(n.removesuffix('.npy') for n in names)}")
    return zf


def _chunks(f: IO[bytes], h: NpyHeader, path: str | Path, member: str) -> Iterator[np.ndarray]:
    """Row blocks ``(k, *shape[1:])`` of a member positioned after its header."""
    n = h.shape[0]
    if h.fortran_order and len(h.shape) > 1:  # rows are not contiguous: read it whole
        f.seek(0)
        yield np.lib.format.read_array(f, allow_pickle=False)
        return
    row_bytes = h.dtype.itemsize * math.prod(h.shape[1:])
    per = max(1, CHUNK_BYTES // max(row_bytes, 1))
    for start in range(0, n, per):
        k = min(per, n - start)
        buf = f.read(k * row_bytes)
        if len(buf) != k * row_bytes:
            raise DataError(path, start, f"{member}: expected {n} rows, the data ends early",
                            unit="row")  # fmt: skip
        yield np.frombuffer(buf, dtype=h.dtype).reshape(k, *h.shape[1:])


def read_npz(path: str | Path) -> Iterator[ArrayExample]:
    """``(x row as float32 (F,), label)`` in file order, streamed and checked row by row."""
    hx, hy = npz_headers(path)
    with ExitStack() as stack:
        zf = stack.enter_context(_open_zip(path))
        fx, fy = stack.enter_context(zf.open("x.npy")), stack.enter_context(zf.open("y.npy"))
        _read_header(fx, path, "x")
        _read_header(fy, path, "y")
        ys = _chunks(fy, hy, path, "y")
        y_buf, row = np.zeros(0, np.int64), 0
        for xb in _chunks(fx, hx, path, "x"):
            x = xb.reshape(len(xb), hx.features).astype(np.float32)  # (k, F)
            while len(y_buf) < len(x):
                y_buf = np.concatenate([y_buf, next(ys).astype(np.int64)])
            y, y_buf = y_buf[: len(x)], y_buf[len(x) :]
            _check_block(x, y, row, path)
            for i in range(len(x)):
                yield x[i], int(y[i])
            row += len(x)


def _check_block(x: np.ndarray, y: np.ndarray, row: int, path: str | Path) -> None:
    bad = ~np.isfinite(x).all(1)  # (k,)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(path, row + i, "expected finite features, got NaN or inf", unit="row")
    if (y < 0).any():
        i = int(np.argmax(y < 0))
        raise DataError(path, row + i, f"expected a label >= 0, got {int(y[i])}", unit="row")


def label_range(path: str | Path) -> tuple[int, int]:
    """``(min, max)`` of ``y`` (streamed; a negative label raises); empty ``y``: ``(0, -1)``."""
    _, hy = npz_headers(path)
    lo, hi, row = 0, -1, 0
    with _open_zip(path) as zf, zf.open("y.npy") as fy:
        _read_header(fy, path, "y")
        for yb in _chunks(fy, hy, path, "y"):
            if len(yb):
                if yb.min() < 0:
                    i = int(np.argmax(yb < 0))
                    raise DataError(path, row + i, f"expected a label >= 0, got {int(yb[i])}",
                                    unit="row")  # fmt: skip
                lo = int(yb.min()) if hi < 0 else min(lo, int(yb.min()))
                hi = max(hi, int(yb.max()))
            row += len(yb)
    return lo, hi


def collate_arrays(examples: list[ArrayExample]) -> dict[str, Tensor]:
    x = torch.from_numpy(np.stack([e[0] for e in examples]))  # (B, F)
    labels = torch.tensor([e[1] for e in examples], dtype=torch.long)  # (B,)
    return {"x": x, "labels": labels}


def build_array_data(
    cfg: DataConfig,
    *,
    batch_size: int,
    seed: int,
    train: Callable[[], Iterable[ArrayExample]],
    valid: Callable[[], Iterable[ArrayExample]] | None,
    counts: tuple[int, int | None],
    in_features: int,
    num_classes: int,
    in_memory: bool,
) -> DataBundle:
    """Sources over array rows (from :func:`read_npz` or memory); counts are known up front."""
    n_train, n_valid = counts
    if valid is None and cfg.valid_every:
        n_train, n_valid = split_counts(n_train, cfg.valid_every)
    buffer = cfg.shuffle_buffer if not in_memory or not cfg.shuffle_buffer else n_train
    tr, va = train_valid_sources(
        train, valid, collate=lambda ex, _seed: collate_arrays(ex), batch_size=batch_size,
        seed=seed, shuffle_buffer=buffer, drop_last=cfg.drop_last, valid_every=cfg.valid_every,
        counts=(n_train, n_valid), length_buckets=cfg.length_buckets,  # refused: no length
    )  # fmt: skip
    info: dict[str, Any] = {"train_examples": n_train, "valid_examples": n_valid}
    return DataBundle(tr, va, {"in_features": in_features, "num_classes": num_classes}, {}, info)


def build_npz_data(cfg: DataConfig, *, batch_size: int, seed: int) -> DataBundle:
    """Streaming sources over ``cfg.train`` (and ``cfg.valid``) NPZ files."""
    train_path, valid_path = cfg.train, cfg.valid
    assert train_path is not None
    hx, _ = npz_headers(train_path)
    hi = label_range(train_path)[1]
    n_valid = None
    if valid_path is not None:
        hv, _ = npz_headers(valid_path)
        if hv.features != hx.features:
            raise DataError(valid_path, None, f"x: expected {hx.features} features per row "
                                              f"like the training file, got {hv.features}")
        hi, n_valid = max(hi, label_range(valid_path)[1]), hv.shape[0]
    if hx.shape[0] == 0:
        raise DataError(train_path, None, "expected at least one row")
    return build_array_data(
        cfg, batch_size=batch_size, seed=seed, train=lambda: read_npz(train_path),
        valid=None if valid_path is None else (lambda: read_npz(valid_path)),
        counts=(hx.shape[0], n_valid), in_features=hx.features, num_classes=hi + 1,
        in_memory=False,
    )  # fmt: skip
