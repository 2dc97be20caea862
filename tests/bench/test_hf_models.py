"""``bench.hf_models --quick``: every family measured, ratios consistent with the times."""

from __future__ import annotations

import pytest

import bench.hf_models as hb


def test_quick_run_measures_every_family():
    out = hb.main(["--quick", "--families", "gpt2", "llama"])
    assert set(out["families"]) == {"gpt2", "llama"}
    for family, r in out["families"].items():
        step = r["train_step"]
        assert step["speedup"] == pytest.approx(step["dense_ms"] / step["tt_ms"], rel=1e-2)
        for row in r["inference"].values():
            assert row["speedup"] == pytest.approx(
                row["original_ms"] / row["exported_ms"], rel=1e-2
            )
        sizes = r["tensorized"]
        assert sizes["layers"] == (4 if family == "gpt2" else 7)  # one block
        assert sizes["tt_params"] < sizes["dense_params"]
        assert r["parameters"]["exported"] < r["parameters"]["original"]
