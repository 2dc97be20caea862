"""bench.late_rates: the uncut control resumes the early checkpoint and judges it every
interval; at rate 0 it is the early model, every judgement its start accuracy exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench import fidelity, fidelity_data, late_rates
from engine.train import JobConfig


def test_the_control_is_a_finetune_at_the_scaled_rates():
    base = fidelity.job(Path("t.npz"), Path("v.npz"), "comera", 0, 40)
    job = JobConfig.from_dict(late_rates.control_job(base, 0.3))
    early, control = job.schedule
    assert control.kind == "finetune" and control.steps == late_rates.STEPS
    assert control.eval_every == late_rates.INTERVAL == job.compression.shrink_every
    for group, rate in fidelity.LR.items():
        assert getattr(control.lr, group) == pytest.approx(0.3 * rate)
    assert early == JobConfig.from_dict(base).schedule[0]  # the fidelity early stage


def test_a_fold_of_wine_judges_every_interval_and_rate_zero_keeps_the_start(
    monkeypatch, tmp_path, capsys
):
    """One fold, a 40-step early stage, 50 control steps at rates 0 and 1 (< 20 s)."""
    monkeypatch.setattr(fidelity, "EARLY_STEPS", 40)
    monkeypatch.setattr(fidelity, "EARLY_EPOCHS", 1)
    monkeypatch.setattr(late_rates, "STEPS", 50)
    monkeypatch.setattr(late_rates, "SCALES", (0.0, 1.0))
    torch.set_num_threads(1)
    x, y, _ = fidelity_data.load("wine")
    fold = late_rates.run_fold("wine", 0, tmp_path, x, y)
    still, moved = fold["runs"]["0"]["accuracy"], fold["runs"]["1"]["accuracy"]
    start = fold["split"]["early_steps"]  # judged every interval after the early stage
    assert fold["runs"]["0"]["steps"] == fold["runs"]["1"]["steps"] == [start + 25, start + 50]
    assert len(still) == len(moved) == 50 // late_rates.INTERVAL
    assert still == [fold["start"]] * 2  # no rate, no cut: the early model as it was
    summary = late_rates.summarize_dataset([fold])
    assert summary["0"]["worst_drop_points"] == [0.0] and summary["0"]["folds_always_within"] == 1
    worst = 100 * (fold["start"] - min(moved))
    assert summary["1"]["worst_drop_points"] == [pytest.approx(worst)]
    assert summary["1"]["first_drop_points"] == [pytest.approx(100 * (fold["start"] - moved[0]))]
    assert summary["1"]["folds_always_within"] == int(worst <= 1.0)
    late_rates.print_markdown({"datasets": {"wine": {"summary": summary}}, "seconds": 1.0})
    assert "| wine |" in capsys.readouterr().out
