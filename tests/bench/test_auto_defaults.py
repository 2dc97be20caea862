"""bench.auto_defaults: the job with only a target_ratio really runs on the engine's defaults."""

from __future__ import annotations

import pytest
import torch

from bench import auto_defaults, fidelity, fidelity_data


def _fast_protocol(monkeypatch):
    monkeypatch.setattr(fidelity, "EARLY_STEPS", 30)
    monkeypatch.setattr(fidelity, "EARLY_EPOCHS", 1)


def test_the_defaults_job_gives_neither_max_rank_nor_gamma(tmp_path):
    spec = auto_defaults.defaults_job(tmp_path / "t.npz", tmp_path / "v.npz", 0, 720)
    assert "max_rank" not in spec["compression"] and "d" not in spec["compression"]
    assert spec["compression"]["layers"] == ["*"]
    [stage] = spec["schedule"]
    assert stage["kind"] == "early" and "gamma" not in stage
    assert stage["target_ratio"] == auto_defaults.TARGET == 0.15
    dense = fidelity.job(tmp_path / "t.npz", tmp_path / "v.npz", "dense", 0, 720, "all")
    assert stage["steps"] == dense["schedule"][0]["steps"] == 720


def test_a_fold_of_wine_runs_the_automatic_ranks_and_gamma(monkeypatch, tmp_path, capsys):
    """One fold, 30 steps (< 20 s): the row's structure, and the ranks came from the
    calibration run (the report's auto_rank entry), not from a max_rank of the job."""
    _fast_protocol(monkeypatch)
    torch.set_num_threads(1)
    x, y, _ = fidelity_data.load("wine")
    row = auto_defaults.run_fold("wine", 0, tmp_path, x, y)
    assert row["chosen"] == {"max_rank": "auto", "gamma": "auto"}
    auto = row["auto_rank"]
    # wine's 13 x 256 input layer stays dense (two cores of it break even at rank 12.4)
    assert set(auto["layers"]) == {"hidden.1"} == set(row["ranks"])
    assert all(len(r) == 3 for r in row["ranks"].values()), row["ranks"]  # no d: two cores
    assert auto["probe_steps"] == 30  # min(100, the stage's 30 steps)
    assert auto["build_rank"] == max(c["rank"] for c in auto["layers"].values())
    assert row["gamma"] is not None and "share" in row["gamma"]  # AutoGamma ran
    assert 0.0 <= row["dense_accuracy"] <= 1.0 and 0.0 <= row["defaults_accuracy"] <= 1.0
    diff = 100 * (row["defaults_accuracy"] - row["dense_accuracy"])
    assert row["diff_points"] == pytest.approx(diff)
    assert row["within_1_point"] == (row["diff_points"] >= -1.0)
    assert row["ratio"] > 1.0 and row["split"]["early_steps"] == 30
    if row["advice"] is not None:
        assert row["advice"]["code"] == "raise_max_rank"
    summary = auto_defaults.summarize_dataset([row])
    assert summary["folds"] == 1 and summary["folds_within_1_point"] == int(row["within_1_point"])
    assert summary["checks"]["within_1_point_on_average"] == row["within_1_point"]
    payload = {
        "datasets": {"wine": {"summary": summary}},
        "checks": {"datasets_within_1_point_on_average": "1/1", "folds_within_1_point": "1/1"},
        "seconds": 1.0,
    }
    auto_defaults.print_markdown(payload)
    assert "| wine |" in capsys.readouterr().out


def test_a_job_that_sets_max_rank_is_refused(monkeypatch, tmp_path):
    _fast_protocol(monkeypatch)
    made = auto_defaults.defaults_job

    def with_rank(*args):
        spec = made(*args)
        spec["compression"]["max_rank"] = 64
        return spec

    monkeypatch.setattr(auto_defaults, "defaults_job", with_rank)
    x, y, _ = fidelity_data.load("wine")
    with pytest.raises(RuntimeError, match="automatic defaults"):
        auto_defaults.run_fold("wine", 0, tmp_path, x, y)
