"""The advice of a guarded late stage that kept none of its cuts
(:func:`engine.train.report.late_stage_advice`): lower rates where the stage jumped from the
rates the stage before ended with, a looser target otherwise; nothing where a cut held."""

from __future__ import annotations

import pytest

from engine.train import FunctionCallback, Trainer
from engine.train.guard import FidelityGuard
from engine.train.optim import get_lr
from engine.train.report import LOWER_LATE_LR, RATE_JUMP, RELAX_LATE_TARGET, late_stage_advice
from tests.engine.train.test_rank_control import LR, mlp_job

EARLY = 60


def _advice(**changes):
    fields = {
        "size_start": 1000,
        "size_end": 1000,
        "target": 500.0,
        "accepted_size": 1000,
        "trials": [{"metric": 0.80}, {"metric": 0.84}, {"metric": None}],
        "metric": "accuracy",
        "reference": 0.86,
        "tolerance": 1.0,
        "lr": {"cores": 0.003, "gates": 0.01, "others": 0.001},
        "lr_before": {"cores": 0.0001, "gates": 0.01, "others": 0.001},
    }
    return late_stage_advice(**{**fields, **changes})


def test_no_cut_kept_after_a_rate_jump_advises_lower_rates():
    advice = _advice()
    assert advice["code"] == LOWER_LATE_LR
    assert advice["value"] == 0.84 and advice["gap_points"] == pytest.approx(2.0)
    assert advice["rate_jump"] == {"cores": pytest.approx(30.0)}  # gates, others: no jump
    assert "learning rates" in advice["fix"] and "max_metric_drop" in advice["fix"]
    assert "30x" in advice["reason"] and "best of its 2 verdicts" in advice["reason"]


def test_no_cut_kept_without_a_jump_advises_a_looser_target():
    advice = _advice(lr_before={"cores": 0.003 / RATE_JUMP * 1.01, "gates": 0.01, "others": 1})
    assert advice["code"] == RELAX_LATE_TARGET and advice["rate_jump"] == {}
    assert "learning rates" not in advice["fix"] and "target_ratio" in advice["fix"]


def test_rates_up_from_zero_and_from_almost_zero():
    zero = _advice(lr_before={"cores": 0.0, "gates": 0.0, "others": 0.0})
    assert zero["code"] == LOWER_LATE_LR and zero["rate_jump"]["cores"] is None
    assert "up from 0" in zero["reason"]
    tiny = _advice(lr_before={"cores": 1e-9, "gates": 1e-9, "others": 1e-9})
    assert "over 1000x" in tiny["reason"]


@pytest.mark.parametrize(
    "changes",
    [
        {"accepted_size": 900},  # a cut held: the stage made progress
        {"size_end": 500},  # the target was reached
        {"target": None},
        {"trials": []},  # nothing was judged
        {"trials": [{"metric": None}]},
        {"reference": None},
    ],
)
def test_no_advice_where_a_cut_held_or_nothing_was_judged(changes):
    assert _advice(**changes) is None


def _run(tmp_path, monkeypatch, early_schedule: str):
    """An early stage, then a late stage whose every verdict fails (the guard's check patched
    in this process), so that it keeps none of its cuts."""
    monkeypatch.setattr(FidelityGuard, "check", lambda self, metrics: False)
    job = mlp_job(
        {"kind": "early", "steps": EARLY, "lr": LR, "lr_schedule": early_schedule},
        {"kind": "late", "steps": 30, "target_ratio": 0.3, "lr": LR},
        compression={"max_metric_drop": 1.0},
    )
    events: list[dict] = []
    result = Trainer(job, workdir=tmp_path, callbacks=[FunctionCallback(events.append)]).run()
    return job, result, events


def test_a_late_stage_after_a_cosine_gets_the_lower_rates_advice(tmp_path, monkeypatch):
    job, result, events = _run(tmp_path, monkeypatch, "cosine")
    late = result.report["stages"][1]
    assert late["target_reached"] is False and late["size_end"] == late["size_start"]
    advice = late["advice"]
    assert advice["code"] == LOWER_LATE_LR
    early = job.schedule[0]
    for group in ("cores", "gates", "others"):  # the rates of the early stage's last step
        want = get_lr(getattr(early.lr, group), EARLY - 1, early, EARLY)
        assert advice["lr_before"][group] == pytest.approx(want, rel=1e-6)
        assert advice["lr"][group] == getattr(job.schedule[1].lr, group)
    assert advice in result.report["advice"]  # the job's list (the early stage may add its own)
    said = [e for e in events if e["event"] == "advice" and e["code"] == LOWER_LATE_LR]
    assert len(said) == 1 and said[0]["reason"] == advice["reason"]


def test_a_late_stage_at_the_rates_before_gets_the_looser_target_advice(tmp_path, monkeypatch):
    _, result, _ = _run(tmp_path, monkeypatch, "constant")
    advice = result.report["stages"][1]["advice"]
    assert advice["code"] == RELAX_LATE_TARGET and advice["lr_before"] == LR
