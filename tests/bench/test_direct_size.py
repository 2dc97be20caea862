"""bench.direct_size: the early stage lands at each factor's size, and the summary follows."""

from __future__ import annotations

import pytest
import torch

from bench import direct_size, fidelity, fidelity_data


def test_a_fold_of_wine_lands_each_factor_at_its_size(monkeypatch, tmp_path, capsys):
    """One fold, 40 steps (< 20 s): each factor's run is the automatic start's early stage at
    ``EARLY_TARGET * t``, and smaller factors end smaller."""
    monkeypatch.setattr(fidelity, "EARLY_STEPS", 40)
    monkeypatch.setattr(fidelity, "EARLY_EPOCHS", 1)
    monkeypatch.setattr(direct_size, "FACTORS", (1.0, 0.5))
    spec = direct_size.size_job(tmp_path / "t.npz", tmp_path / "v.npz", 0, 40, 0.5)
    assert spec["schedule"][0]["target_ratio"] == pytest.approx(fidelity.EARLY_TARGET / 2)
    assert "max_rank" not in spec["compression"] and "d" not in spec["compression"]
    torch.set_num_threads(1)
    x, y, _ = fidelity_data.load("wine")
    fold = direct_size.run_fold("wine", 0, tmp_path, x, y)
    one, half = fold["runs"]["1"], fold["runs"]["0.5"]
    assert half["size"] < one["size"] and half["ratio"] > one["ratio"]
    summary = direct_size.summarize_dataset([fold])
    assert summary["1"]["diff_points"] == [0.0] and summary["1"]["folds_within_1_point"] == 1
    diff = 100 * (half["accuracy"] - one["accuracy"])
    assert summary["0.5"]["diff_points"] == [pytest.approx(diff)]
    assert summary["0.5"]["folds_within_1_point"] == int(diff >= -1.0)
    direct_size.print_markdown({"datasets": {"wine": {"summary": summary}}, "seconds": 1.0})
    assert "| wine | 0.5 |" in capsys.readouterr().out
