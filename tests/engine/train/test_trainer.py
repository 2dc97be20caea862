"""The trainer end to end on tiny jobs: exact resume, cancellation, stages, events."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch

from engine.rank import model_size, stored_size
from engine.train import FunctionCallback, JobConfig, Trainer
from tests.helpers.specs import engine_job, stages, synthetic_data, transformer_model

MODEL = transformer_model()
DATA = synthetic_data("nli", n_train=80, n_valid=24, max_len=24, vocab_size=120, shuffle_buffer=32)
COMERA_SCHEDULE = stages(
    early={"steps": 6, "gamma": 1.0, "lr": {"gates": 0.3}},
    late={"steps": 6, "target_ratio": 0.5, "lr": {"gates": 0.3}},
    finetune={"steps": 3},
)
PLAIN_SCHEDULE = stages(early={"steps": 9, "lr": {"cores": 1e-3}}, finetune={"epochs": 1})


def make_job(method: str = "comera", **changes) -> JobConfig:
    cfg = engine_job(
        name="t",
        method=method,
        model=copy.deepcopy(MODEL),
        data=dict(DATA),
        compression={"max_rank": 4, "shrink_every": 2},
        schedule=copy.deepcopy(COMERA_SCHEDULE if method == "comera" else PLAIN_SCHEDULE),
        training={"batch_size": 16, "seed": 1, "log_every": 2},
        checkpoint={"every_steps": 4, "keep": 10},
        galore={"rank": 4, "update_proj_gap": 3},
    )
    cfg.update(changes)
    return JobConfig.from_dict(cfg)


def train_steps(job: JobConfig, workdir, tokenizer_from=None):
    """``job`` trained in ``workdir`` (a new directory): the result and its step events.
    ``tokenizer_from``: a run's directory whose trained tokenizer this run takes (the
    tokenizer's trainer is not deterministic), so that two runs see the same batches."""
    if tokenizer_from is not None:
        workdir.mkdir()
        shutil.copy(tokenizer_from / "tokenizer.json", workdir / "tokenizer.json")
    events: list[dict] = []
    result = Trainer(job, workdir=workdir, callbacks=[FunctionCallback(events.append)]).run()
    return result, [e for e in events if e["event"] == "step"]


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_bitwise(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"


def _assert_same_run(want, got) -> None:
    """Two runs' results (``TrainResult``) ended bitwise alike: parameters, and every stage
    report but its wall time."""
    _assert_bitwise(_params(want.model), _params(got.model))

    def stages(result) -> list[dict]:
        return [{k: v for k, v in s.items() if k != "seconds"} for s in result.report["stages"]]

    assert stages(got) == stages(want)


@pytest.mark.parametrize("method", ["comera", "dense", "galore"])
def test_resume_from_checkpoint_is_bitwise_exact(tmp_path, method):
    job = make_job(method)
    full = Trainer(job, workdir=tmp_path / "full").run()
    assert full.status == "completed"
    ckpts = sorted((tmp_path / "full" / "checkpoints").glob("step-*.safetensors"))
    assert len(ckpts) >= 2
    resumed = Trainer(job, workdir=tmp_path / "full", resume=ckpts[1]).run()
    _assert_bitwise(_params(full.model), _params(resumed.model))
    assert resumed.report["steps"] == full.report["steps"]


def test_cancel_then_resume_matches_uninterrupted(tmp_path):
    job = make_job("comera", checkpoint={"keep": 2})
    full = Trainer(job, workdir=tmp_path / "a").run()
    polls = {"n": 0}

    def stop() -> bool:
        polls["n"] += 1
        return polls["n"] > 7  # stop before the 8th step (inside the late stage)

    events = []
    (tmp_path / "b").mkdir()  # same trained tokenizer (tokenizers' trainer is not deterministic)
    shutil.copy(tmp_path / "a" / "tokenizer.json", tmp_path / "b" / "tokenizer.json")
    part = Trainer(
        job, workdir=tmp_path / "b", should_stop=stop, callbacks=[FunctionCallback(events.append)]
    ).run()
    assert part.status == "cancelled"
    assert part.report["steps"] == 7
    marks = [e for e in events if e["event"] == "checkpoint"]
    assert marks[-1]["partial"] is True
    rest = Trainer(job, workdir=tmp_path / "b", resume=part.checkpoint).run()
    assert rest.status == "completed"
    _assert_bitwise(_params(full.model), _params(rest.model))


def test_stages_shrink_and_meet_the_target(tmp_path):
    events = []
    job = make_job("comera")
    result = Trainer(job, workdir=tmp_path, callbacks=[FunctionCallback(events.append)]).run()
    kinds = [e["event"] for e in events]
    for needed in ("stage_start", "stage_end", "step", "eval", "ranks", "checkpoint", "progress"):
        assert needed in kinds, needed
    late = result.report["stages"][1]
    assert late["kind"] == "late"
    assert late["size_ref"] == pytest.approx(0.5 * late["size_start"])
    assert late["size_end"] <= late["size_ref"]
    # the late objective ran in eager mode: lambda was computed every step
    late_steps = [e for e in events if e["event"] == "step" and e["kind"] == "late"]
    assert late_steps and all(0.0 <= e["lambda"] <= 1.0 for e in late_steps)
    # finetune cannot grow the size back; the size model matches the live cores
    assert result.report["stages"][2]["size_end"] <= late["size_ref"]
    model = result.model
    for mod in model.modules():
        if hasattr(mod, "shrink_"):
            mod.shrink_()
    assert model_size(model) == stored_size(model)
    ranks = [e for e in events if e["event"] == "ranks"]
    first = sum(v["params"] for v in ranks[0]["layers"].values())
    last = sum(v["params"] for v in ranks[-1]["layers"].values())
    assert last < first


def test_gates_do_not_move_in_finetune(tmp_path):
    job = make_job(
        "comera", schedule=[{"kind": "early", "steps": 2}, {"kind": "finetune", "steps": 4}]
    )
    seen = {}

    class Spy(FunctionCallback):
        pass

    trainer = Trainer(job, workdir=tmp_path)

    def grab(event):
        if event["event"] == "stage_start" and event["kind"] == "finetune":
            seen["gates"] = [g.detach().clone() for g in _gates(trainer.model)]

    trainer.events.callbacks.append(Spy(grab))
    trainer.run()
    after = [g.detach() for g in _gates(trainer.model)]
    assert [tuple(g.shape) for g in after] == [tuple(g.shape) for g in seen["gates"]]
    assert all(torch.equal(a, b) for a, b in zip(after, seen["gates"], strict=True))


def _gates(model):
    return [g for m in model.modules() if hasattr(m, "gates") for g in m.gates]


def test_no_matching_layer_is_a_config_error(tmp_path):
    from engine.train import ConfigError

    job = make_job("comera", compression={"max_rank": 4, "layers": ["nothing.*"]})
    with pytest.raises(ConfigError) as info:
        Trainer(job, workdir=tmp_path)
    assert info.value.field == "compression.layers"


def test_branch_a_finished_stage_into_new_stages(tmp_path):
    """A checkpoint taken at a stage boundary continues under different later stages."""
    early = make_job("comera", schedule=COMERA_SCHEDULE[:1])
    first = Trainer(early, workdir=tmp_path).run()
    branched = make_job("comera")  # same early stage, then late + finetune
    result = Trainer(branched, workdir=tmp_path, resume=first.checkpoint).run()
    assert [s["kind"] for s in result.report["stages"]] == ["early", "late", "finetune"]
    assert result.report["stages"][0] == first.report["stages"][0]
    changed = make_job("comera", schedule=[{**COMERA_SCHEDULE[0], "gamma": 2.0}])
    with pytest.raises(ValueError, match="different job config"):
        Trainer(changed, workdir=tmp_path, resume=first.checkpoint)
