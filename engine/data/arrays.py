"""Arrays for an MLP from an NPZ file: ``x`` (N, F) or (N, ...) features, ``y`` (N,) labels.

The archive is read member by member without unpickling anything (the safety of
``np.load(..., allow_pickle=False)``): each ``.npy`` header is parsed with
``numpy.lib.format`` and an object dtype is refused. Rows are streamed in chunks of about
1 MiB from the (stored or deflated) zip members, so a file larger than memory trains; a
Fortran-ordered member (``np.savez(path, x=a.T)``) is memory-mapped when stored and read
whole, up to a limit, when compressed (:mod:`engine.data.npy_fortran`).

Checks (each a :class:`DataError` naming the file and, for a row, its 0-based index): both
members present, stored or deflated (the methods numpy writes) and not encrypted; each header
a shape of integers >= 0 whose data size (item size x elements) is what the member holds; ``x``
real-valued (bool / int / float, cast to float32) with at least one dimension and finite
values; ``y`` a 1-D integer array of the same length with labels >= 0. A damaged archive (a
bad local header, a corrupt deflate stream, a wrong CRC, data that ends early) is a
:class:`DataError` too, whatever :mod:`zipfile` or :mod:`zlib` raised.
``x`` rows are flattened to ``F = prod(shape[1:])`` features (1 for a 1-D ``x``). The number of
classes is ``max(y) + 1`` over the training and validation labels (one cheap pass over ``y``).

Batches (contract ``mlp``): ``x`` (B, F) float32, ``labels`` (B,) long.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import Tensor

from engine.data.config import DataConfig
from engine.data.errors import DataError
from engine.data.npy_fortran import fortran_blocks, fortran_bytes_in_memory
from engine.data.source import DataBundle, split_counts, train_valid_sources

__all__ = [
    "NpyHeader",
    "npz_headers",
    "read_npz",
    "label_range",
    "npz_bytes_in_memory",
    "collate_arrays",
    "build_array_data",
    "build_npz_data",
]

CHUNK_BYTES = 1 << 20
METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
# what zipfile and zlib raise on a damaged archive (encryption and methods are checked first)
DAMAGED = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, OverflowError)
ArrayExample = tuple[np.ndarray, int]  # (x row (F,) float32, label)


@dataclass(frozen=True)
class NpyHeader:
    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype

    @property
    def features(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)


@contextmanager
def _damage_is_data_error(path: str | Path) -> Iterator[None]:
    """Turns what :mod:`zipfile` and :mod:`zlib` raise on a damaged archive into DataError."""
    try:
        yield
    except DAMAGED as e:
        raise DataError(path, None, f"expected a readable .npz archive ({e})") from None


def _read_header(f: IO[bytes], path: str | Path, member: str, size: int) -> NpyHeader:
    """The header of a member of ``size`` bytes (uncompressed); ``f`` is left at its data."""
    try:
        major, _ = np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0
            if major == 1
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read(f)
    except ValueError as e:
        raise DataError(path, None, f"{member}: expected a .npy array ({e})") from None
    if dtype.hasobject:
        raise DataError(
            path,
            None,
            f"{member}: expected a numeric array, got dtype {dtype}; "
            "object (pickled) arrays are refused",
        )
    if not all(type(d) is int and d >= 0 for d in shape):
        raise DataError(path, None, f"{member}: expected a shape of integers >= 0, got {shape}")
    h = NpyHeader(tuple(shape), bool(fortran), dtype)
    if h.nbytes != size - f.tell():
        raise DataError(
            path,
            None,
            f"{member}: the header declares {h.nbytes} bytes of data ({dtype} {h.shape}), "
            f"the member holds {size - f.tell()}",
        )
    return h


def _open_member(
    zf: zipfile.ZipFile, stack: ExitStack, path: str | Path, member: str
) -> tuple[IO[bytes], NpyHeader]:
    """``(file positioned at the data, header)`` of member ``x`` or ``y``."""
    f = stack.enter_context(zf.open(f"{member}.npy"))
    return f, _read_header(f, path, member, zf.getinfo(f"{member}.npy").file_size)


def npz_headers(path: str | Path) -> tuple[NpyHeader, NpyHeader]:
    """Validated headers of ``x`` and ``y`` (nothing else is read)."""
    with _damage_is_data_error(path), ExitStack() as stack:
        zf = stack.enter_context(_open_zip(path))
        hx, hy = _open_member(zf, stack, path, "x")[1], _open_member(zf, stack, path, "y")[1]
    if hx.dtype.kind not in "biuf" or not hx.shape:
        raise DataError(
            path,
            None,
            f"x: expected a real array of shape (N, ...), got dtype "
            f"{hx.dtype} and shape {hx.shape}",
        )
    if hy.dtype.kind not in "iu" or len(hy.shape) != 1:
        raise DataError(
            path, None, f"y: expected 1-D integer labels, got dtype {hy.dtype} and shape {hy.shape}"
        )
    if hy.shape[0] != hx.shape[0]:
        raise DataError(
            path,
            None,
            f"expected as many labels as rows, got x with "
            f"{hx.shape[0]} rows and y with {hy.shape[0]}",
        )
    return hx, hy


def _open_zip(path: str | Path) -> zipfile.ZipFile:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(path, None, f"expected an .npz archive ({e})") from None
    names = set(zf.namelist())
    if not {"x.npy", "y.npy"} <= names:
        zf.close()
        raise DataError(
            path,
            None,
            f"expected arrays 'x' and 'y', got {sorted(n.removesuffix('.npy') for n in names)}",
        )
    for member in ("x", "y"):
        info = zf.getinfo(f"{member}.npy")
        if info.flag_bits & 0x1:
            reason = "is encrypted"
        elif info.compress_type not in METHODS:
            reason = f"uses compression method {info.compress_type} (only stored or deflated)"
        else:
            continue
        zf.close()
        raise DataError(path, None, f"{member}: the member {reason}")
    return zf


def _chunks(
    f: IO[bytes], h: NpyHeader, path: str | Path, member: str, zf: zipfile.ZipFile
) -> Iterator[np.ndarray]:
    """Row blocks ``(k, *shape[1:])`` of a member of ``zf`` positioned after its header."""
    n = h.shape[0]
    if h.fortran_order and len(h.shape) > 1:  # rows are not contiguous (npy_fortran)
        yield from fortran_blocks(zf, f, h.shape, h.dtype, path, member)
        return
    row_bytes = h.dtype.itemsize * math.prod(h.shape[1:])
    per = max(1, CHUNK_BYTES // max(row_bytes, 1))
    for start in range(0, n, per):
        k = min(per, n - start)
        buf = f.read(k * row_bytes)
        if len(buf) != k * row_bytes:
            raise DataError(
                path, start, f"{member}: expected {n} rows, the data ends early", unit="row"
            )
        yield np.frombuffer(buf, dtype=h.dtype).reshape(k, *h.shape[1:])


def read_npz(path: str | Path) -> Iterator[ArrayExample]:
    """``(x row as float32 (F,), label)`` in file order, streamed and checked row by row."""
    hx, hy = npz_headers(path)
    with _damage_is_data_error(path), ExitStack() as stack:
        zf = stack.enter_context(_open_zip(path))
        fx, fy = _open_member(zf, stack, path, "x")[0], _open_member(zf, stack, path, "y")[0]
        ys = _chunks(fy, hy, path, "y", zf)
        y_buf, row = np.zeros(0, np.int64), 0
        for xb in _chunks(fx, hx, path, "x", zf):
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
    with _damage_is_data_error(path), ExitStack() as stack:
        zf = stack.enter_context(_open_zip(path))
        fy = _open_member(zf, stack, path, "y")[0]
        for yb in _chunks(fy, hy, path, "y", zf):
            if len(yb):
                if yb.min() < 0:
                    i = int(np.argmax(yb < 0))
                    raise DataError(
                        path, row + i, f"expected a label >= 0, got {int(yb[i])}", unit="row"
                    )
                lo = int(yb.min()) if hi < 0 else min(lo, int(yb.min()))
                hi = max(hi, int(yb.max()))
            row += len(yb)
    return lo, hi


def npz_bytes_in_memory(path: str | Path) -> int:
    """Bytes a reader of ``path`` holds beyond its 1 MiB blocks: the data of a compressed
    Fortran-ordered ``x`` (a DataError past ``npy_fortran``'s limit), else 0."""
    hx, _ = npz_headers(path)
    if not hx.fortran_order or len(hx.shape) < 2:
        return 0
    with _damage_is_data_error(path), _open_zip(path) as zf:
        info = zf.getinfo("x.npy")
    return fortran_bytes_in_memory(path, "x", info, hx.nbytes)


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
        train,
        valid,
        collate=lambda ex, _seed: collate_arrays(ex),
        batch_size=batch_size,
        seed=seed,
        shuffle_buffer=buffer,
        drop_last=cfg.drop_last,
        valid_every=cfg.valid_every,
        counts=(n_train, n_valid),
        length_buckets=cfg.length_buckets,  # refused: no length
    )
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
            raise DataError(
                valid_path,
                None,
                f"x: expected {hx.features} features per row "
                f"like the training file, got {hv.features}",
            )
        hi, n_valid = max(hi, label_range(valid_path)[1]), hv.shape[0]
    if hx.shape[0] == 0:
        raise DataError(train_path, None, "expected at least one row")
    return build_array_data(
        cfg,
        batch_size=batch_size,
        seed=seed,
        train=lambda: read_npz(train_path),
        valid=None if valid_path is None else (lambda: read_npz(valid_path)),
        counts=(hx.shape[0], n_valid),
        in_features=hx.features,
        num_classes=hi + 1,
        in_memory=False,
    )
