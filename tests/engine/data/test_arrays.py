"""NPZ loader: rows against np.load(allow_pickle=False), chunked streaming, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.data.arrays as arrays
from engine.data import DataConfig, DataError, build_data


def _build(path, **kw):
    cfg = DataConfig(kind="npz", train=str(path), shuffle_buffer=0, **kw)
    return build_data(cfg, arch="mlp", batch_size=7, seed=0)


def _collect(source, epoch=0):
    xs, ys = zip(*[(b["x"], b["labels"]) for b in source.batches(epoch)], strict=True)
    return torch.cat(xs), torch.cat(ys)


@pytest.mark.parametrize("save", ["savez", "savez_compressed", "fortran"])
@pytest.mark.parametrize("chunk", [1 << 20, 100])
def test_rows_match_numpy_reference(tmp_path, monkeypatch, save, chunk):
    monkeypatch.setattr(arrays, "CHUNK_BYTES", chunk)  # 100 bytes: many chunks of 4 rows
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3, 2))
    y = rng.integers(0, 5, size=50).astype(np.int16)
    path = tmp_path / "a.npz"
    if save == "fortran":
        np.savez(path, x=np.asfortranarray(x), y=y)
    else:
        getattr(np, save)(path, x=x, y=y)
    ref = np.load(path, allow_pickle=False)
    b = _build(path)
    assert b.model_overrides == {"in_features": 6, "num_classes": int(ref["y"].max()) + 1}
    assert b.train.num_examples() == 50 and b.train.num_batches() == 8
    gx, gy = _collect(b.train)
    assert gx.dtype == torch.float32 and gy.dtype == torch.long
    assert torch.equal(gx, torch.from_numpy(ref["x"].reshape(50, 6).astype(np.float32)))
    assert torch.equal(gy, torch.from_numpy(ref["y"].astype(np.int64)))


def test_shuffle_is_exactly_once_and_split_by_index(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, x=np.arange(40, dtype=np.float32)[:, None], y=np.arange(40) % 3)
    b = build_data(
        DataConfig(kind="npz", train=str(path), shuffle_buffer=6, valid_every=4),
        arch="mlp",
        batch_size=5,
        seed=2,
    )
    assert (b.train.num_examples(), b.valid.num_examples()) == (30, 10)
    tr0, tr1 = (_collect(b.train, e)[0][:, 0].long().tolist() for e in (0, 1))
    va = _collect(b.valid)[0][:, 0].long().tolist()
    assert va == list(range(3, 40, 4))
    assert sorted(tr0) == sorted(tr1) == [i for i in range(40) if i % 4 != 3] and tr0 != tr1


def test_valid_file_widens_classes(tmp_path):
    np.savez(tmp_path / "t.npz", x=np.zeros((4, 2)), y=np.array([0, 1, 1, 0]))
    np.savez(tmp_path / "v.npz", x=np.ones((3, 2)), y=np.array([0, 3, 1]))
    cfg = DataConfig(kind="npz", train=str(tmp_path / "t.npz"), valid=str(tmp_path / "v.npz"))
    b = build_data(cfg, arch="mlp", batch_size=2, seed=0)
    assert b.model_overrides["num_classes"] == 4 and b.valid.num_examples() == 3
    np.savez(tmp_path / "v.npz", x=np.ones((3, 5)), y=np.array([0, 3, 1]))
    with pytest.raises(DataError, match="expected 2 features"):
        build_data(cfg, arch="mlp", batch_size=2, seed=0)


def test_pickled_object_array_is_refused(tmp_path):
    path = tmp_path / "evil.npz"
    obj = np.empty(3, dtype=object)
    obj[:] = [{"a": 1}, [2], "three"]
    np.savez(path, x=obj, y=np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="allow_pickle"):  # the reference refuses too
        np.load(path, allow_pickle=False)["x"]
    with pytest.raises(DataError, match="object .pickled. arrays are refused") as err:
        _build(path)
    assert err.value.path == str(path) and err.value.line is None


MALFORMED = [
    ({"x": np.zeros((3, 2))}, None, r"expected arrays 'x' and 'y', got \['x'\]"),
    ({"x": np.zeros((3, 2)), "y": np.zeros(4, np.int64)}, None, "as many labels as rows"),
    ({"x": np.zeros((3, 2)), "y": np.zeros(3)}, None, "integer labels"),
    ({"x": np.zeros((3, 2)), "y": np.zeros((3, 1), np.int64)}, None, "1-D integer labels"),
    ({"x": np.array(["a", "b"]), "y": np.zeros(2, np.int64)}, None, "real array"),
    ({"x": np.zeros((3, 2)), "y": np.array([0, -1, 2])}, 1, "label >= 0, got -1"),
    ({"x": np.array([[0.0], [1.0], [np.nan]]), "y": np.zeros(3, np.int64)}, 2, "finite"),
]


@pytest.mark.parametrize("arrays_,row,match", MALFORMED)
def test_malformed_npz(tmp_path, arrays_, row, match):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays_)
    with pytest.raises(DataError, match=match) as err:
        list(_build(path).train.batches(0))
    assert (err.value.path, err.value.line) == (str(path), row)
    if row is not None:
        assert err.value.unit == "row" and f"row {row}" in str(err.value)


def test_not_an_npz(tmp_path):
    path = tmp_path / "bad.npz"
    path.write_text("hello")
    with pytest.raises(DataError, match="expected an .npz archive"):
        _build(path)
