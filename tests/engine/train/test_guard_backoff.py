"""The fidelity guard backs off instead of stopping (:mod:`engine.train.guard`,
:mod:`engine.train.prune_events`): a cut that costs too much is undone to the last accepted
state, bitwise (weights, gates, optimizer state, importance window), and retried smaller
after more recovery steps; every verdict is in the events and the stage report; a run resumed
after a back-off is bitwise the uninterrupted one. Small MLP jobs on the CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.train import FunctionCallback, Trainer
from engine.train.guard import LR_BACK_OFF, MIN_LR_SCALE, FidelityGuard
from engine.train.optim import get_lr
from tests.engine.train.test_rank_control import LR, mlp_job
from tests.engine.train.test_trainer import _assert_same_run

EARLY = 80


def _job(**changes: Any):
    return mlp_job(
        {"kind": "early", "steps": EARLY, "lr": LR},
        {"kind": "late", "steps": 40, "target_ratio": 0.02, "lr": LR},
        {"kind": "finetune", "steps": 5},
        compression={"max_metric_drop": 0.0},
        checkpoint={"every_steps": 2, "keep": 20},
        **changes,
    )


def _state(t: Trainer) -> dict[str, Any]:
    """Everything a restore must put back, copied."""
    opt = {
        t.names[p]: {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
        for p, st in t.optimizer.state.items()
    }
    imp = t.control.importance
    return {
        "model": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
        "optim": opt,
        "importance": (imp.sums.clone(), imp.count.clone()),
    }


def _assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["model"].keys() == want["model"].keys()
    for k, v in want["model"].items():
        assert got["model"][k].shape == v.shape and torch.equal(got["model"][k], v), k
    assert got["optim"].keys() == want["optim"].keys()
    for name, st in want["optim"].items():
        assert got["optim"][name].keys() == st.keys(), name
        for k, v in st.items():
            g = got["optim"][name][k]
            assert torch.equal(g, v) if torch.is_tensor(v) else g == v, (name, k)
    assert torch.equal(got["importance"][0], want["importance"][0])
    assert torch.equal(got["importance"][1], want["importance"][1])


@pytest.fixture(scope="module")
def backed_off(tmp_path_factory):
    """One guarded run that backs off; the state at every accept and after every restore."""
    path = tmp_path_factory.mktemp("backoff")
    events: list[dict] = []
    seen: dict[str, Any] = {"accepted": None, "checks": 0, "rates": []}
    holder: dict[str, Trainer] = {}

    def on_event(event: dict) -> None:
        events.append(event)
        t = holder.get("t")
        if event["event"] == "progress" and event["stage"] == 1:  # the rates this step ran at
            lrs = {g["name"]: float(g["lr"]) for g in t.optimizer.param_groups}
            seen["rates"].append((event["stage_step"], lrs, t.control.lr_scale()))
        if event["event"] == "stage_start" and event["stage"] == 1:
            seen["accepted"] = _state(t)  # the guard's first snapshot: the stage start
        if event["event"] != "guard" or event["stage"] != 1:
            return
        if event["decision"] == "accept":
            seen["accepted"] = _state(t)
        elif event["decision"] in ("back_off", "restore", "stop"):
            _assert_same_state(_state(t), seen["accepted"])  # the last accepted, bitwise
            seen["checks"] += 1

    job = _job()
    trainer = Trainer(job, workdir=path, callbacks=[FunctionCallback(on_event)])
    holder["t"] = trainer
    result = trainer.run()
    return job, path, result, events, seen


def test_a_back_off_restores_exactly_the_last_accepted_state(backed_off):
    _, _, result, events, seen = backed_off
    late = result.report["stages"][1]
    backs = [r for r in late["retries"] if r["decision"] == "back_off"]
    assert backs, "the job must back off for this test to mean anything"
    assert seen["checks"] == len([r for r in late["retries"] if r["decision"] != "accept"])
    # the restored model is the one of the last accept, not necessarily the stage start
    assert any(r["restored_step"] > EARLY for r in backs)


def test_the_retry_cut_is_smaller_and_the_stage_goes_on(backed_off):
    _, _, result, events, _ = backed_off
    early, late = result.report["stages"][:2]
    cuts = late["prune_events"]
    for entry in (r for r in late["retries"] if r["decision"] == "back_off" and r["cut_step"]):
        failed = entry["size_before"] - entry["size_cut"]
        retry = next(
            c for c in cuts if c["step"] >= entry["step"] and c["step"] > entry["cut_step"]
        )
        assert retry["size_before"] <= entry["restored_size"]  # from the restored model
        assert retry["size_before"] - retry["size_after"] < failed  # a smaller cut
        assert entry["next_cut"] <= max(failed // 2, entry["one_rank"])
    # the stage did not stop at the first failure; it ends honest about its target
    assert late["steps"] == 40 or "less than one rank" in late["reason"]
    assert late["target_reached"] is False and late["size_end"] > late["size_ref"]
    assert "fell below" in late["reason"] and "restored the model of step" in late["reason"]
    assert late["metrics"]["accuracy"] >= early["metrics"]["accuracy"]  # tolerance 0
    assert late["guard"]["back_offs"] >= 1


def test_a_back_off_lowers_the_stage_rates_from_then_on(backed_off):
    job, _, result, _, seen = backed_off
    stage = job.schedule[1]
    late = result.report["stages"][1]
    backs = [r for r in late["retries"] if r["decision"] == "back_off"]
    want = [max(LR_BACK_OFF ** (i + 1), MIN_LR_SCALE) for i in range(len(backs))]
    assert [r["next_lr_scale"] for r in backs] == pytest.approx(want)
    rates = seen["rates"]
    assert want[-1] < 1.0 and rates[0][2] == 1.0 and rates[-1][2] == pytest.approx(want[-1])
    # each step ran at its schedule's rates times the scale the guard held before it
    for (_, _, scale), (stage_step, lrs, _) in zip(rates, rates[1:], strict=False):
        for name, lr in lrs.items():
            base = get_lr(getattr(stage.lr, name), stage_step - 1, stage, late["steps"])
            assert lr == pytest.approx(base * scale, rel=1e-12), (stage_step, name)


def test_every_retry_is_an_event_and_in_the_report(backed_off):
    _, _, result, events, _ = backed_off
    late = result.report["stages"][1]
    guard = [e for e in events if e["event"] == "guard" and e["stage"] == 1]
    verdicts = [(e["step"], e["decision"]) for e in guard]
    for entry in late["retries"]:  # back-offs and the verdicts of retried cuts
        assert (entry["step"], entry["decision"]) in verdicts
        assert {"step", "size_before", "size_after", "metric", "decision"} <= entry.keys()
    for e in guard:
        assert e["decision"] in ("accept", "back_off", "stop", "restore")
        assert {"size_before", "size_after", "value", "floor"} <= e.keys()
    end = next(e for e in events if e["event"] == "stage_end" and e["stage"] == 1)
    assert end["retries"] == late["retries"]


def test_resume_after_a_back_off_is_bitwise(backed_off):
    job, path, result, _, _ = backed_off
    late = result.report["stages"][1]
    first = next(r for r in late["retries"] if r["decision"] == "back_off")
    # the first checkpoint after the back-off: the restored model, cap and wait in flight
    ckpts = sorted((path / "checkpoints").glob("step-*.safetensors"))
    ckpt = next(p for p in ckpts if int(p.stem.split("-")[1]) > first["step"])
    _assert_same_run(result, Trainer(job, workdir=path / "again", resume=ckpt).run())


def test_the_guard_backs_off_by_halves_and_stops_at_one_rank():
    guard = FidelityGuard("accuracy", 1.0, interval=5)
    guard.reference, guard.accepted = 0.9, {"step": 10, "size": 1000, "metric": 0.9}
    bad = {"accuracy": 0.5}
    guard.cut_made(10, 10, 1000, 600)
    entry = guard.back_off(15, 580, bad, one_rank=50, final=False)
    assert entry["decision"] == "back_off" and guard.cap == 200 and guard.wait == 10
    assert guard.lr_scale == entry["next_lr_scale"] == LR_BACK_OFF
    assert guard.limit(1000, 100.0) == 800  # at most the cap below the size
    assert guard.limit(1000, 900.0) == 900  # never below the bound
    guard.cut_made(15, 15, 1000, 800)
    assert not guard.due(24) and guard.due(25)  # judged after the longer wait
    entry = guard.back_off(25, 800, bad, one_rank=50, final=False)
    assert entry["decision"] == "back_off" and guard.cap == 100 and guard.wait == 15
    guard.cut_made(25, 25, 1000, 950)  # a single rank: nothing smaller is left to try
    assert guard.back_off(40, 950, bad, one_rank=50, final=False)["decision"] == "stop"
    guard.cut_made(40, 40, 1000, 900)
    assert guard.back_off(45, 900, bad, one_rank=50, final=True)["decision"] == "restore"
    assert guard.lr_scale == LR_BACK_OFF**2  # only a back-off lowers the rates
    # the penalty, not a cut, shrank the model below the snapshot: restored, the limits stay
    entry = guard.back_off(46, 700, bad, one_rank=50, final=False)
    assert entry["decision"] == "back_off" and entry["cut_step"] is None
    assert (guard.cap, guard.wait) == (100, 15) and guard.lr_scale == LR_BACK_OFF**3
    for _ in range(10):  # never below the floor
        guard.back_off(47, 700, bad, one_rank=50, final=False)
    assert guard.lr_scale == MIN_LR_SCALE
    guard.cut_made(45, 45, 1000, 920)
    guard.passed(50, 920, {"accuracy": 0.95})
    assert guard.wait == 5 and guard.retries[-1]["decision"] == "accept"
    # the whole state survives a checkpoint's JSON
    again = FidelityGuard.from_state(guard.to_dict(), {})
    assert again.to_dict() == guard.to_dict()
