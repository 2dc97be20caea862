"""Fortran-ordered NPZ arrays: read by rows in bounded memory, the memory bomb refused.

A 413 KB upload whose ``x.npy`` declares a Fortran-ordered (25,000,000 x 4) float32 array
took 1,573 MB in the worker: Fortran-ordered members were read whole and then cast whole. Now
a stored member is memory-mapped and copied out a block at a time, and a compressed one is
read whole only up to ``FORTRAN_IN_MEMORY_MAX_BYTES``, refused before any of it is read past.
"""

from __future__ import annotations

import io
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from engine.data import DataConfig, DataError, build_data
from engine.data.arrays import npz_bytes_in_memory, read_npz
from engine.data.npy_fortran import FORTRAN_IN_MEMORY_MAX_BYTES


def _npy_header(shape: tuple[int, ...], fortran: bool, dtype: str = "<f4") -> bytes:
    buf = io.BytesIO()
    header = {"descr": dtype, "fortran_order": fortran, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def write_zeros_npz(path, rows: int, features: int, *, compress: int) -> None:
    """An NPZ with a Fortran-ordered float32 ``x`` of zeros and ``y`` of zeros, streamed into
    the archive (never held in memory)."""
    with zipfile.ZipFile(path, "w", compression=compress) as zf:
        with zf.open("x.npy", "w", force_zip64=True) as f:
            f.write(_npy_header((rows, features), True))
            left, block = rows * features * 4, bytes(1 << 20)
            while left:
                f.write(block[: min(left, len(block))])
                left -= min(left, len(block))
        with zf.open("y.npy", "w", force_zip64=True) as f:
            f.write(_npy_header((rows,), False, "<i2"))
            left = rows * 2
            while left:
                f.write(bytes(min(left, 1 << 20)))
                left -= min(left, 1 << 20)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
@pytest.mark.parametrize("shape", [(3000, 5), (700, 3, 4), (1, 9)])
def test_fortran_rows_are_the_c_order_rows(tmp_path, save, shape):
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(np.float32)
    y = rng.integers(0, 4, size=shape[0])
    path = tmp_path / "f.npz"
    save(path, x=np.asfortranarray(x), y=y)
    got = list(read_npz(path))
    assert np.array_equal(np.stack([r for r, _ in got]), x.reshape(shape[0], -1))
    assert [label for _, label in got] == y.tolist()


def test_a_stored_fortran_array_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "big.npz"
    n, f = 100_000, 256
    x = np.asfortranarray((np.arange(n * f) % 1000).astype(np.float32).reshape(n, f))
    np.savez(path, x=x, y=np.zeros(n, np.int8))  # 102 MB of x, stored
    del x
    assert npz_bytes_in_memory(path) == 0
    tracemalloc.start()
    try:
        rows = 0
        for i, (row, _) in enumerate(read_npz(path)):
            if i in (0, n - 1):
                assert row.tolist() == [float((f * i + j) % 1000) for j in range(f)]
            rows += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == n
    assert peak < 24 << 20, f"peak {peak / 2**20:.0f} MiB for a 102 MB array"


def test_the_compressed_fortran_bomb_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "bomb.npz"
    write_zeros_npz(path, 25_000_000, 4, compress=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 1 << 20  # 400 MB of x in well under 1 MB
    with pytest.raises(DataError, match="np.savez"):
        npz_bytes_in_memory(path)
    cfg = DataConfig(kind="npz", train=str(path), shuffle_buffer=0)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        bundle = build_data(cfg, arch="mlp", batch_size=8, seed=0)
        with pytest.raises(DataError, match="cannot be read by rows"):
            next(iter(bundle.train.batches(0)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 30
    assert peak < 32 << 20, f"peak {peak / 2**20:.0f} MiB"


def test_a_small_compressed_fortran_array_is_read_whole(tmp_path):
    path = tmp_path / "small.npz"
    write_zeros_npz(path, 1000, 4, compress=zipfile.ZIP_DEFLATED)
    assert npz_bytes_in_memory(path) == 16_000 <= FORTRAN_IN_MEMORY_MAX_BYTES
    assert sum(1 for _ in read_npz(path)) == 1000
