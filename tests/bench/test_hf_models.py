"""``bench.hf_models --quick``: every family measured, ratios consistent with the times."""

from __future__ import annotations

import pytest

import bench.hf_models as hb


def test_quick_run_measures_every_family():
    out = hb.main(["--quick", "--families", "gpt2", "llama", "--threads", "1"])
    assert set(out["families"]) == {"gpt2", "llama"}
    # speedups are rounded to 3 decimals (abs 5e-4): a slow outlier on a loaded host makes
    # one tiny (0.017 against 0.01726 unrounded), where 1% alone would not hold
    for family, r in out["families"].items():
        step = r["train_step"]
        ratio = step["dense_ms"] / step["tt_ms"]
        assert step["speedup"] == pytest.approx(ratio, rel=1e-2, abs=5e-4)
        for row in r["inference"].values():
            ratio = row["original_ms"] / row["exported_ms"]
            assert row["speedup"] == pytest.approx(ratio, rel=1e-2, abs=5e-4)
        sizes = r["tensorized"]
        assert sizes["layers"] == (4 if family == "gpt2" else 7)  # one block
        assert sizes["tt_params"] < sizes["dense_params"]
        assert r["parameters"]["exported"] < r["parameters"]["original"]
