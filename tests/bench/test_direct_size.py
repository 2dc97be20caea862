"""bench.direct_size: the early stage lands at each factor's size, and the summary follows."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from bench import common, direct_size, fidelity, fidelity_data


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


def test_fold_benchmark_runs_every_fold_and_writes_what_it_returns(monkeypatch, tmp_path):
    """The shared ``main`` of the per-fold benchmarks (direct_size, auto_defaults, late_rates):
    the command line's folds run, the payload's protocol starts with the command line's."""
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["demo", "--reps", "2", "--datasets", "wine", "--jobs", "1"])
    payload = fidelity_data.fold_benchmark(
        "demo",
        "A demo.\n\nMore.",
        lambda name, rep, tmp, x, y: {"fold": rep, "rows": len(y)},
        lambda folds: {"folds": [f["fold"] for f in folds]},
        lambda datasets: {"question": "q?", "protocol": {"k": sorted(datasets)}},
    )
    assert json.loads((tmp_path / "demo.json").read_text()) == payload
    assert payload["benchmark"] == "demo" and payload["question"] == "q?"
    assert payload["protocol"] == {
        "reps": 2,
        "jobs": 1,
        "threads": 1,
        "datasets": ["wine"],
        "k": ["wine"],
    }
    assert payload["datasets"]["wine"]["summary"] == {"folds": [0, 1]}
    assert [f["rows"] for f in payload["datasets"]["wine"]["folds"]] == [178, 178]
