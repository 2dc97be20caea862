"""Criteo TSV loader: reference features, malformed lines, exactly-once shuffling, flat memory."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine.data import DataConfig, DataError, build_data
from engine.data.synthetic import write_synthetic

ROOT = Path(__file__).resolve().parents[3]
ROWS = [7, 1, 13, 97, 2**20] + [1000 + t for t in range(21)]  # hash buckets per table


def _line(rng: random.Random, i: int) -> str:
    label = str(rng.randint(0, 1))
    ints = [str(i)] + [rng.choice(["", "0", "-1", "-7", "3", "150", str(2**40)]) for _ in range(12)]
    hexes = [
        rng.choice(
            [
                "",
                "0",
                "ff",
                "DEADBEEF",
                "a1B2c3d4",
                "ffffffffffffffff",
                f"{rng.getrandbits(32):08x}",
            ]
        )
        for _ in range(26)
    ]
    return "\t".join([label, *ints, *hexes])


def _write(path: Path, n: int, seed: int = 0, newline: str = "\n") -> Path:
    rng = random.Random(seed)
    path.write_text("".join(_line(rng, i) + newline for i in range(n)))
    return path


def _reference(path: Path) -> list[tuple[float, list[float], list[int]]]:
    out = []
    for line in path.read_text().splitlines():
        f = line.split("\t")
        dense = [math.log1p(max(int(v), 0)) if v else 0.0 for v in f[1:14]]
        sparse = [int(v, 16) % r if v else r for v, r in zip(f[14:], ROWS, strict=True)]
        out.append((float(f[0]), dense, sparse))
    return out


def _rows(batches) -> list[tuple[float, list[float], list[int]]]:
    return [
        (float(y), d.tolist(), s.tolist())
        for b in batches
        for y, d, s in zip(b["labels"], b["dense"], b["sparse"], strict=True)
    ]


def _cfg(path: Path, **kw) -> DataConfig:
    return DataConfig(kind="criteo", train=str(path), num_rows=ROWS, **kw)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_features_match_plain_python_reference(tmp_path, newline):
    path = _write(tmp_path / "c.tsv", 50, newline=newline)
    b = build_data(_cfg(path, shuffle_buffer=0), arch="dlrm", batch_size=8, seed=0)
    assert b.model_overrides == {"n_dense": 13, "table_sizes": [r + 1 for r in ROWS]}
    batch = next(b.train.batches(0))
    assert batch["dense"].dtype == torch.float32 and batch["dense"].shape == (8, 13)
    assert batch["sparse"].dtype == torch.long and batch["sparse"].shape == (8, 26)
    assert batch["labels"].dtype == torch.float32 and batch["labels"].shape == (8,)
    got = _rows(b.train.batches(0))
    ref = _reference(path)
    assert len(got) == len(ref) == 50
    for (y, d, s), (ry, rd, rs) in zip(got, ref, strict=True):
        assert y == ry and s == rs
        assert torch.allclose(torch.tensor(d), torch.tensor(rd), rtol=1e-6, atol=0)


@pytest.mark.parametrize("buffer", [1, 7, 64, 1000])
def test_every_row_once_per_epoch_and_epochs_differ(tmp_path, buffer):
    path = _write(tmp_path / "c.tsv", 203)
    b = build_data(_cfg(path, shuffle_buffer=buffer), arch="dlrm", batch_size=16, seed=5)
    ids = {e: [round(math.expm1(r[1][0])) for r in _rows(b.train.batches(e))] for e in (0, 1)}
    assert sorted(ids[0]) == sorted(ids[1]) == list(range(203))
    assert ids[0] == [round(math.expm1(r[1][0])) for r in _rows(b.train.batches(0))]
    if buffer > 1:
        assert ids[0] != ids[1] and ids[0] != list(range(203))
    assert b.train.num_batches() == math.ceil(203 / 16)


def test_valid_split_and_drop_last(tmp_path):
    path = _write(tmp_path / "c.tsv", 30)
    b = build_data(_cfg(path, valid_every=5, drop_last=True), arch="dlrm", batch_size=4, seed=0)
    va = [round(math.expm1(r[1][0])) for r in _rows(b.valid.batches(0))]
    tr = [round(math.expm1(r[1][0])) for r in _rows(b.train.batches(0))]
    assert va == [4, 9, 14, 19, 24, 29]
    assert len(tr) == 24 and set(tr) == set(range(30)) - set(va)  # 24 = 6 full batches


def _tsv(fields: list[str]) -> str:
    return "\t".join(fields) + "\n"


GOOD = ["1"] + ["5"] * 13 + ["abc"] * 26
MALFORMED = [
    (GOOD[:-1], "expected 40 tab-separated fields"),
    (GOOD + ["x"], "got 41"),
    (["2"] + GOOD[1:], "expected label 0 or 1 in field 1"),
    ([""] + GOOD[1:], "expected label 0 or 1"),
    (GOOD[:3] + ["1.5"] + GOOD[4:], r"integer or an empty field in field 4 \(I3\)"),
    (GOOD[:13] + ["abc"] + GOOD[14:], r"field 14 \(I13\)"),
    (GOOD[:14] + ["xyz"] + GOOD[15:], r"hex string .* field 15 \(C1\)"),
    (GOOD[:20] + ["0x1f"] + GOOD[21:], r"field 21 \(C7\)"),
    (GOOD[:39] + ["1" * 17], r"field 40 \(C26\)"),
    (GOOD[:2] + [" 5"] + GOOD[3:], r"field 3 \(I2\)"),
    (GOOD[:2] + [str(2**70)] + GOOD[3:], "64 bits"),
]


@pytest.mark.parametrize("fields,match", MALFORMED)
def test_malformed_line_names_file_line_and_field(tmp_path, fields, match):
    path = tmp_path / "bad.tsv"
    path.write_text(_tsv(GOOD) * 3 + _tsv(fields) + _tsv(GOOD))
    b = build_data(_cfg(path), arch="dlrm", batch_size=2, seed=0)
    with pytest.raises(DataError, match=match) as err:
        list(b.train.batches(0))
    assert (err.value.path, err.value.line) == (str(path), 4)


def test_empty_line_is_an_error(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text(_tsv(GOOD) + "\n" + _tsv(GOOD))
    with pytest.raises(DataError, match="got 1") as err:
        list(build_data(_cfg(path), arch="dlrm", batch_size=2, seed=0).train.batches(0))
    assert err.value.line == 2


_PROBE = textwrap.dedent("""
    import json, sys
    from engine.data import DataConfig, build_data

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1])  # kB

    warm, path = sys.argv[1], sys.argv[2]
    cfg = DataConfig(kind="criteo", train=warm, num_rows=1000, shuffle_buffer=2000)
    for batch in build_data(cfg, arch="dlrm", batch_size=256, seed=0).train.batches(0):
        pass
    source = build_data(cfg.replace(train=path), arch="dlrm", batch_size=256, seed=0).train
    base = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to VmRSS
    rows = sum(len(b["labels"]) for b in source.batches(1))
    print(json.dumps({"rows": rows, "growth_kb": status("VmHWM") - base}))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_memory_stays_flat_as_the_file_grows(tmp_path):
    small = Path(write_synthetic("criteo", tmp_path, n_train=10_000, seed=1).train)
    big = tmp_path / "big.tsv"
    block = small.read_bytes()
    with open(big, "wb") as f:
        for _ in range(10):
            f.write(block)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(small), str(p)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in (small, big)
    ]
    out = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert [o["rows"] for o in out] == [10_000, 100_000]  # nothing dropped
    growth = out[1]["growth_kb"] - out[0]["growth_kb"]
    assert growth < 4096, f"peak RSS grew {growth} kB for a 10x larger file: {out}"
