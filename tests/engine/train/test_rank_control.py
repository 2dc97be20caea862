"""Rank control in the trainer: gradual cuts along the bound, the fidelity guard, the auto
gamma, the chance flag and exact resume across all of it (small MLP jobs on the CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.rank import tensorized_layers
from engine.rank.schedule import LATE_END, size_bound
from engine.train import FunctionCallback, JobConfig, Trainer
from engine.train.checkpoint import read_checkpoint
from tests.engine.train.test_trainer import _assert_bitwise, _assert_same_run, _params
from tests.helpers.specs import early_stage, engine_job, late_stage, mlp_model, synthetic_data

LR = {"cores": 0.003, "gates": 0.01, "others": 0.001}


def mlp_job(*stages, **changes) -> JobConfig:
    cfg = engine_job(
        name="rank-control",
        method="comera",
        model=mlp_model(64, 64, dropout=0.0),
        data=synthetic_data(
            "mlp", n_train=640, n_valid=256, params={"shape": [16], "num_classes": 4, "noise": 0.8}
        ),
        compression={"max_rank": 16, "d": 2, "shrink_every": 5, "layers": ["hidden.1"]},
        schedule=list(stages)
        or [early_stage(steps=60, lr=LR), late_stage(steps=40, target_ratio=0.3, lr=LR)],
        training={"batch_size": 32, "seed": 3, "log_every": 10},
    )
    for key, value in changes.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return JobConfig.from_dict(cfg)


def run(job: JobConfig, path, **kw):
    events: list[dict] = []
    result = Trainer(job, workdir=path, callbacks=[FunctionCallback(events.append)], **kw).run()
    return result, events


def test_late_stage_cuts_gradually_along_the_bound_and_reaches_the_target(tmp_path):
    job = mlp_job(compression={"max_metric_drop": None})
    result, events = run(job, tmp_path)
    late = result.report["stages"][1]
    assert late["target_reached"] and late["size_end"] <= late["size_ref"]
    cuts = late["prune_events"]
    assert len(cuts) >= 4  # many small cuts, not one at the end
    s0, target = late["size_start"], late["size_ref"]
    for cut in cuts:
        stage_step = cut["step"] - 60
        assert cut["bound"] == int(size_bound(stage_step, 40, s0, target, end=LATE_END))
        assert cut["size_after"] <= cut["bound"] < cut["size_before"]
    assert [c["bound"] for c in cuts] == sorted((c["bound"] for c in cuts), reverse=True)
    assert "guard" not in late and "reason" not in late
    # the MLP's layer has no bypass: never cut to rank 0
    assert all(min(m.active_ranks()) >= 1 for _, m in tensorized_layers(result.model))
    assert result.report["target"]["target_reached"] is True
    assert any(e["event"] == "ranks" and e["stage"] == 1 for e in events)


def test_the_guard_keeps_a_stage_within_tolerance_and_says_why_it_ends_short(tmp_path):
    job = mlp_job(
        {"kind": "early", "steps": 80, "lr": LR},
        {"kind": "late", "steps": 40, "target_ratio": 0.02, "lr": LR},
        {"kind": "finetune", "steps": 5},
        compression={"max_metric_drop": 0.0},
        checkpoint={"every_steps": 3, "keep": 20},
    )
    result, events = run(job, tmp_path)
    early, late = result.report["stages"][:2]
    start = early["metrics"]["accuracy"]
    assert late["target_reached"] is False
    assert late["size_end"] > late["size_ref"]
    assert "fell below" in late["reason"] and "restored the model of step" in late["reason"]
    assert late["metrics"]["accuracy"] >= start  # tolerance 0 points: never below the start
    # the first failed cut did not end the stage: it backed off and went on
    first = next(r for r in late["retries"] if r["decision"] != "accept")
    assert first["decision"] == "back_off" and late["prune_events"][-1]["step"] > first["step"]
    assert late["guard"]["reference"] == pytest.approx(start)
    summary = result.report["target"]
    assert summary == {
        "stage": 1,
        "target_reached": False,
        "size_target": late["size_ref"],
        "size_end": late["size_end"],
        "ratio_reached": late["size_end"] / late["size_start"],
        "reason": late["reason"],
    }
    ends = [e for e in events if e["event"] == "stage_end" and e["stage"] == 1]
    assert ends and ends[0]["reason"] == late["reason"]
    assert result.report["stages"][2]["kind"] == "finetune"  # the job goes on
    # a resume from inside the stage, before the first restore, ends it the same way, bitwise
    inside = tmp_path / "checkpoints" / "step-00000081.safetensors"
    assert first["step"] > 81
    again, _ = run(job, tmp_path, resume=inside)
    _assert_bitwise(_params(result.model), _params(again.model))
    assert again.report["stages"][1]["reason"] == late["reason"]


def test_resume_inside_a_guarded_gradual_late_stage_is_bitwise(tmp_path):
    job = mlp_job(
        {"kind": "early", "steps": 30, "lr": LR},
        {"kind": "late", "steps": 40, "target_ratio": 0.2, "lr": LR},
        {"kind": "finetune", "steps": 6},
        checkpoint={"every_steps": 3, "keep": 20},
        compression={"max_metric_drop": 10.0},
    )
    full, _ = run(job, tmp_path / "full")
    late = full.report["stages"][1]
    assert late["prune_events"], "the stage must cut for this test to mean anything"
    ckpts = sorted((tmp_path / "full" / "checkpoints").glob("step-*.safetensors"))
    # inside the late stage, between two prune events (shrink_every 5): a window in flight
    end = 30 + late["steps"]
    mid = [p for p in ckpts if 30 < (step := int(p.stem.split("-")[1])) < end and step % 5]
    assert mid
    for path in (mid[0], mid[len(mid) // 2], mid[-1]):
        tensors, _ = read_checkpoint(path)
        trainer = Trainer(job, workdir=tmp_path / "probe", resume=path)
        control = trainer.control
        assert control.importance is not None and control.guard is not None
        assert int(control.importance.count) == int(tensors["rank/importance/count"]) > 0
        assert torch.equal(control.importance.sums, tensors["rank/importance/sums"])
        snap = {k[len("guard/") :]: v for k, v in tensors.items() if k.startswith("guard/")}
        assert snap and snap.keys() == control.guard.snapshot.keys()
        assert all(torch.equal(snap[k], control.guard.snapshot[k]) for k in snap)
        resumed, _ = run(job, tmp_path / "full", resume=path)
        _assert_same_run(full, resumed)


def test_auto_gamma_turns_gates_off_and_paces_to_the_early_target(tmp_path):
    job = mlp_job(
        {"kind": "early", "steps": 100, "gamma": "auto", "target_ratio": 0.4, "lr": LR},
        compression={"max_rank": 16},
    )
    result, events = run(job, tmp_path)
    early = result.report["stages"][0]
    assert early["size_end"] < early["size_start"]
    assert early["target_reached"] and early["size_end"] <= early["size_ref"]
    gammas = [e["gamma"] for e in events if e["event"] == "step"]
    assert gammas and all(g >= 0 for g in gammas) and max(gammas) > 0
    assert 0 < early["gamma"]["share"] <= 0.5


def test_auto_gamma_without_a_target_never_kills_a_layer(tmp_path):
    job = mlp_job(
        {"kind": "early", "steps": 120, "gamma": "auto", "lr": {**LR, "gates": 0.05}},
        compression={"min_rank_fraction": 0.25, "layers": ["hidden.*"]},
    )
    result, _ = run(job, tmp_path)
    assert all(min(m.active_ranks()) >= 1 for _, m in tensorized_layers(result.model))


def test_a_model_at_chance_is_flagged_and_a_learned_one_is_not(tmp_path):
    frozen = {"cores": 0.0, "gates": 0.0, "others": 0.0}
    stuck, _ = run(mlp_job({"kind": "early", "steps": 5, "lr": frozen}), tmp_path / "a")
    learned, _ = run(mlp_job({"kind": "early", "steps": 80, "lr": LR}), tmp_path / "b")
    a, b = stuck.report["chance"], learned.report["chance"]
    assert a["at_chance"] is True and b["at_chance"] is False
    assert a["chance"] == max(a["majority"], 0.25) and a["uniform"] == 0.25
    assert b["value"] == learned.report["stages"][0]["metrics"]["accuracy"]


def test_the_first_log_after_a_resume_averages_the_whole_window(tmp_path):
    job = mlp_job(
        {"kind": "early", "steps": 40, "lr": LR},
        checkpoint={"every_steps": 7, "keep": 20},
        training={"log_every": 10},
    )
    _, full = run(job, tmp_path / "full")
    ckpt = tmp_path / "full" / "checkpoints" / "step-00000014.safetensors"
    _, resumed = run(job, tmp_path / "full", resume=ckpt)

    def step20(events):
        (e,) = [e for e in events if e["event"] == "step" and e["step"] == 20]
        return {k: v for k, v in e.items() if k != "seconds_per_step"}

    assert step20(resumed) == step20(full)


def test_config_refuses_auto_outside_early_and_targets_without_auto():
    base = copy.deepcopy(LR)
    with pytest.raises(ValueError, match=r"schedule\[0\].gamma"):
        mlp_job({"kind": "late", "steps": 5, "gamma": "auto", "target_ratio": 0.5, "lr": base})
    with pytest.raises(ValueError, match=r"schedule\[0\].target_ratio"):  # a fixed gamma
        mlp_job({"kind": "early", "steps": 5, "target_ratio": 0.5, "gamma": 0.01, "lr": base})
    # no gamma given: a targeted early stage takes "auto"
    job = mlp_job({"kind": "early", "steps": 5, "target_ratio": 0.5, "lr": base})
    assert job.schedule[0].gamma == "auto"
    with pytest.raises(ValueError, match=r"compression.max_metric_drop"):
        mlp_job(compression={"max_metric_drop": -1.0})
    with pytest.raises(ValueError, match=r"target_ratio"):
        mlp_job({"kind": "late", "steps": 5, "target_ratio": 1.0, "lr": base})
