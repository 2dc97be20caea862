"""Recovery-paced late stages (``steps: "auto"``, :mod:`engine.train.rank_control`) and the
finetune's guard (:mod:`engine.train.prune_events`): a cut waits for the verdict on the last
one, a cut under the floor recovers longer before it is undone, the stage ends at the first
accepted model at or below ``S*``; a finetune that falls under the late stage's floor ends
with its start model back. Small MLP jobs on the CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pydantic import ValidationError

from api_schemas.job_training import StageSpec
from engine.train import ConfigError, FunctionCallback, Trainer
from engine.train.config import DEFAULT_AUTO_MAX_STEPS, StageConfig
from engine.train.guard import AUTO_MAX_WAIT
from tests.engine.train.test_rank_control import LR, mlp_job
from tests.engine.train.test_trainer import _assert_bitwise, _assert_same_run, _params

EARLY, SHRINK = 60, 5


def _job(drop: float, max_steps: int = 300, **finetune: Any):
    return mlp_job(
        {"kind": "early", "steps": EARLY, "lr": LR},
        {"kind": "late", "steps": "auto", "max_steps": max_steps, "target_ratio": 0.4, "lr": LR},
        {"kind": "finetune", "steps": 10, **finetune},
        compression={"max_metric_drop": drop},
        checkpoint={"every_steps": 10, "keep": 20},  # every step of a 220-step run kept
    )


def _run(job, path, **kw):
    events: list[dict] = []
    result = Trainer(job, workdir=path, callbacks=[FunctionCallback(events.append)], **kw).run()
    return result, events


def test_steps_auto_is_for_late_stages_and_bounded_the_same_on_the_wire():
    stage = StageConfig.from_dict({"kind": "late", "steps": "auto", "target_ratio": 0.5}, "s")
    assert stage.auto_steps and stage.step_limit == DEFAULT_AUTO_MAX_STEPS
    wire = StageSpec.model_validate({"kind": "late", "steps": "auto", "target_ratio": 0.5})
    assert wire.max_steps == DEFAULT_AUTO_MAX_STEPS
    with pytest.raises(ConfigError) as err:
        StageConfig.from_dict({"kind": "early", "steps": "auto"}, "s")
    assert err.value.field.endswith("steps")
    with pytest.raises(ConfigError) as err:
        StageConfig.from_dict(
            {"kind": "late", "steps": 10, "max_steps": 5, "target_ratio": 0.5}, "s"
        )
    assert err.value.field.endswith("max_steps")
    for bad in ({"kind": "early", "steps": "auto"}, {"kind": "late", "steps": 9, "max_steps": 5}):
        with pytest.raises(ValidationError):
            StageSpec.model_validate({**bad, "target_ratio": 0.5})


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    """A lenient guard: the stage reaches S* and ends before its bound."""
    path = tmp_path_factory.mktemp("paced")
    return _run(_job(drop=50.0), path)


def test_a_paced_stage_ends_at_the_first_accepted_model_at_its_target(paced):
    result, events = paced
    late = result.report["stages"][1]
    assert late["target_reached"] and late["size_end"] <= late["size_ref"]
    assert late["steps"] < 300 and late["paced"]["reached_at"] == EARLY + late["steps"]
    first = late["paced"]["first_cut"]
    assert first == -(-(late["size_start"] - late["size_ref"]) // 8)
    # J = L: no switch between loss and size, and no size change but the cuts'
    steps = [e for e in events if e["event"] == "step" and e["stage"] == 1]
    assert steps and all("lambda" not in e for e in steps)
    cuts = late["prune_events"]
    assert len(cuts) >= 2
    verdicts = [e for e in events if e["event"] == "guard" and e["stage"] == 1 and e["cut"]]
    for before, after in zip(cuts, cuts[1:], strict=False):
        # each cut waits for the verdict on the one before: accepted in between
        assert any(
            before["step"] < v["step"] <= after["step"] and v["decision"] == "accept"
            for v in verdicts
        )
        assert after["size_before"] - after["bound"] <= first  # at most one step of the pace


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """Tolerance 0: cuts fall under the floor, recover, and are undone."""
    path = tmp_path_factory.mktemp("strict")
    job = _job(drop=0.0, max_steps=150)
    result, events = _run(job, path)
    return job, path, result, events


def test_a_cut_under_the_floor_recovers_longer_before_it_is_undone(strict):
    _, _, result, events = strict
    late = result.report["stages"][1]
    recover = [r for r in late["retries"] if r["decision"] == "recover"]
    assert recover, "a cut must fall under the floor for this test to mean anything"
    for entry in recover:  # the cut stays on trial: nothing was restored
        event = next(e for e in events if e["event"] == "guard" and e["step"] == entry["step"])
        assert event["size_now"] == event["size_after"] == entry["size_cut"]
        assert entry["step"] - entry["cut_step"] < AUTO_MAX_WAIT * SHRINK
    for entry in late["retries"]:
        if entry["decision"] == "back_off" and entry["cut_step"] is not None:
            assert entry["step"] - entry["cut_step"] >= AUTO_MAX_WAIT * SHRINK
    assert late["guard"]["back_offs"] == len(
        [r for r in late["retries"] if r["decision"] not in ("accept", "recover")]
    )


def test_resume_during_a_recovery_is_bitwise(strict):
    job, path, result, _ = strict
    late = result.report["stages"][1]
    first = next(r for r in late["retries"] if r["decision"] == "recover")
    ckpts = sorted((path / "checkpoints").glob("step-*.safetensors"))
    ckpt = next(p for p in ckpts if int(p.stem.split("-")[1]) >= first["step"])
    _assert_same_run(result, Trainer(job, workdir=path / "again", resume=ckpt).run())


def test_a_finetune_under_the_late_floor_ends_with_its_start_model(tmp_path):
    # a learning rate that wrecks the model: the finetune ends under the late stage's floor
    job = _job(drop=1.0, lr={"cores": 5.0, "others": 5.0})
    starts: dict[str, Any] = {}

    def on_event(event: dict) -> None:
        if event["event"] == "stage_start" and event["stage"] == 2:
            starts["params"] = {k: v.clone() for k, v in _params(holder[0].model).items()}

    holder: list[Trainer] = []
    trainer = Trainer(job, workdir=tmp_path, callbacks=[FunctionCallback(on_event)])
    holder.append(trainer)
    result = trainer.run()
    late, finetune = result.report["stages"][1:]
    assert finetune["guard"]["reference"] == late["guard"]["reference"]
    assert [r["decision"] for r in finetune["retries"]] == ["restore"]
    assert finetune["retries"][0]["metric"] < finetune["guard"]["reference"] - 0.01
    _assert_bitwise(starts["params"], _params(result.model))
    assert finetune["metrics"]["accuracy"] >= late["guard"]["reference"] - 0.01 - 1e-12


def test_a_finetune_within_the_floor_keeps_its_own_model(paced):
    result, _ = paced
    finetune = result.report["stages"][2]
    assert finetune["guard"]["back_offs"] == 0 and "retries" not in finetune
    assert torch.is_tensor(next(iter(_params(result.model).values())))
