"""``bench.lm_pretrain --quick``: the three runs happen and the ratios follow from them."""

from __future__ import annotations

import pytest

import bench.lm_pretrain as lp


def test_quick_run_compares_dense_comera_and_the_compressed_dense_model():
    out = lp.main(["--quick", "--threads", "1"])  # two wait on each other on busy cores
    dense, comera, ratios = out["dense"], out["comera"], out["ratios"]
    assert dense["steps"] == comera["steps"] == out["steps"]  # equal tokens
    for method, run in (("dense", dense), ("comera", comera)):  # each at its grid's best rate
        grid = out["lr_grid"][method]
        assert run["perplexity"] == min(g["perplexity"] for g in grid)
        assert run["lr"] == out["lr"][method] and run["lr"] in [g["lr"] for g in grid]
    assert ratios["perplexity_comera_over_dense_equal_tokens"] == pytest.approx(
        comera["perplexity"] / dense["perplexity"], rel=1e-3
    )
    assert comera["tensorized_layers_params"] < comera["tensorized_layers_dense_params"]
    at = dense["at_comera_wall_time"]
    assert at is None or at["seconds"] <= comera["train_seconds"]
    assert out["text"]["valid_source"].startswith("the Python Language Reference")
    for allocation in ("uniform", "energy"):
        squeezed = out["compressed_dense"][allocation]
        assert squeezed["tensorized_ratio"] > 1
        assert squeezed["perplexity_before"] > 1 and squeezed["perplexity_after"] > 1
