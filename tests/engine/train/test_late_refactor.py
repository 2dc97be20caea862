"""A late stage's ``linear_d`` (:mod:`engine.train.refactor_stage`): at its start the two-core
layers are rewritten in two modes a side without changing what the model computes, the stage
cuts the new bonds, a run resumed inside the stage (or the finetune after it) is bitwise the
uninterrupted one, and the exported checkpoint loads with the layers as they were trained."""

from __future__ import annotations

import pytest
import torch

from api_schemas import JobCreate
from engine.export import export_compressed, load_compressed
from engine.export.manifest import CheckpointError
from engine.nn.tt_linear import TTLinear
from engine.train import FunctionCallback, Trainer
from engine.train.checkpoint import read_checkpoint, save_checkpoint
from engine.train.config import ConfigError
from engine.train.refactor_stage import export_options, stage_linear_d
from tests.engine.train.test_rank_control import LR, mlp_job
from tests.engine.train.test_trainer import _assert_same_run, make_job
from tests.helpers.specs import mlp_model, stages, synthetic_dataset
from worker.automatic import automatic_choices

EARLY = 30


def _job(**changes):
    return mlp_job(
        {"kind": "early", "steps": EARLY, "lr": LR},
        {"kind": "late", "steps": 20, "target_ratio": 0.3, "lr": LR, "linear_d": 2},
        {"kind": "finetune", "steps": 6},
        checkpoint={"every_steps": 3, "keep": 20},
        compression={"d": 1, "layers": ["hidden.*"], "max_metric_drop": 50.0},
        **changes,
    )


@pytest.fixture(scope="module")
def refactored(tmp_path_factory):
    path = tmp_path_factory.mktemp("refactor")
    events: list[dict] = []
    job = _job()
    trainer = Trainer(job, workdir=path, callbacks=[FunctionCallback(events.append)])
    result = trainer.run()
    return job, path, trainer, result, events


def test_the_late_stage_starts_from_the_same_model_in_two_modes_a_side(refactored):
    job, _, trainer, result, events = refactored
    starts = {e["stage"]: e for e in events if e["event"] == "stage_start"}
    assert "refactored" not in starts[0] and "refactored" not in starts[2]
    done = starts[1]["refactored"]
    assert set(done) == {"hidden.0", "hidden.1"}
    assert all(len(r["ranks_before"]) == 3 and len(r["ranks_after"]) == 5 for r in done.values())
    early, late = result.report["stages"][:2]
    # the late stage measured its start on the rewritten model: what the early stage ended at
    assert late["guard"]["reference"] == early["metrics"]["accuracy"]
    assert late["size_start"] >= early["size_end"]  # plus the two small outer cores a layer
    for name in done:
        layer = result.model.get_submodule(name)
        assert isinstance(layer, TTLinear) and len(layer.in_modes) == 2
    assert trainer.refactored == done


def test_the_late_stage_cuts_the_new_bonds(refactored):
    _, _, _, result, _ = refactored
    late = result.report["stages"][1]
    assert late["size_end"] <= late["size_start"] * 0.3 + 1e-9
    outer_cut = []
    for name in ("hidden.0", "hidden.1"):
        layer = result.model.get_submodule(name)
        ranks = layer.active_ranks()  # (1, r_1, r_2, r_3, 1)
        outer_cut.append(ranks[1] < layer.in_modes[0] or ranks[3] < layer.out_modes[-1])
    assert any(outer_cut)  # a bond a two-core layer does not have


def test_resume_inside_the_late_stage_and_the_finetune_is_bitwise(refactored):
    job, path, _, result, _ = refactored
    ckpts = sorted((path / "checkpoints").glob("step-*.safetensors"))
    inside = [p for p in ckpts if EARLY < int(p.stem.split("-")[1]) < EARLY + 26]
    assert inside
    for ckpt in (inside[0], inside[-1]):
        _assert_same_run(result, Trainer(job, workdir=path / "again", resume=ckpt).run())


def test_the_fast_path_learns_the_new_layers_and_resumes_bitwise(tmp_path):
    """A transformer on the fast path, its attention projections rewritten: a run resumed
    inside the late stage (its fast path learns from the rewritten model) is bitwise the
    uninterrupted one (whose fast path forgets the old layers' sibling runs at the rewrite)."""
    job = make_job(
        compression={"max_rank": 4, "d": 1, "shrink_every": 2, "layers": ["encoder.*"]},
        schedule=stages(
            early={"steps": 6, "gamma": 1.0, "lr": {"gates": 0.3}},
            late={"steps": 6, "target_ratio": 0.5, "lr": {"gates": 0.3}, "linear_d": 2},
            finetune={"steps": 3},
        ),
        training={"batch_size": 16, "seed": 1, "log_every": 2, "fast_path": True},
        checkpoint={"every_steps": 1, "keep": 20},
    )
    events: list[dict] = []
    want = Trainer(job, workdir=tmp_path, callbacks=[FunctionCallback(events.append)]).run()
    assert want.report["execution"]["fast_path"]
    start = next(e for e in events if e["event"] == "stage_start" and e["stage"] == 1)
    assert any(name.endswith("attn.q") for name in start["refactored"])
    ckpts = sorted((tmp_path / "checkpoints").glob("step-*.safetensors"))
    inside = [p for p in ckpts if 6 < int(p.stem.split("-")[1]) < 12]
    assert inside
    _assert_same_run(want, Trainer(job, workdir=tmp_path, resume=inside[0]).run())


def test_the_export_rebuilds_the_refactored_layers(refactored, tmp_path):
    _, _, trainer, result, _ = refactored
    kwargs = {
        "arch": "mlp",
        "model_config": trainer.model_config.to_dict(),
        "tensorized": True,
    }
    export_compressed(result.model, tmp_path / "ok", options=export_options(trainer), **kwargs)
    loaded, _ = load_compressed(tmp_path / "ok")
    x = torch.randn(9, 16)
    with torch.no_grad():
        assert torch.allclose(loaded(x), result.model.eval()(x), rtol=1e-5, atol=1e-6)
    plain = trainer.job.compression.options.to_dict()  # the job's options alone build 1 mode
    export_compressed(result.model, tmp_path / "plain", options=plain, **kwargs)
    with pytest.raises(CheckpointError, match="in_modes"):
        load_compressed(tmp_path / "plain")


def test_linear_d_is_for_late_stages_only():
    with pytest.raises(ConfigError, match="linear_d"):
        mlp_job({"kind": "early", "steps": 3, "linear_d": 2})
    with pytest.raises(ConfigError, match="linear_d"):
        mlp_job({"kind": "late", "steps": 3, "target_ratio": 0.5, "linear_d": 0})
    spec = {
        "name": "refactor",
        "model": mlp_model(32),
        "dataset": synthetic_dataset(),
        "schedule": stages(early={"steps": 3, "linear_d": 2}),
    }
    with pytest.raises(ValueError, match="linear_d"):
        JobCreate.model_validate(spec)
    spec["schedule"] = stages(early={"steps": 3}, late={"steps": 3, "target_ratio": 0.5})
    spec["schedule"][1]["linear_d"] = 2
    assert JobCreate.model_validate(spec).schedule[1].linear_d == 2


def _auto_job(late: dict | None = None, **compression):
    """Ranks left to the engine (two cores), a late stage with ``late``'s extra fields."""
    return mlp_job(
        {"kind": "early", "steps": EARLY, "lr": LR, "target_ratio": 0.5},
        {"kind": "late", "steps": 12, "target_ratio": 0.5, "lr": LR, **(late or {})},
        checkpoint={"every_steps": 3, "keep": 20},
        compression={
            "max_rank": "auto",
            "d": None,
            "layers": ["hidden.*"],
            "max_metric_drop": 50.0,
            **compression,
        },
    )


def test_the_engine_rewrites_the_two_cores_it_chose_unless_told_otherwise():
    late = lambda job: job.schedule[1]  # noqa: E731
    auto = _auto_job()
    assert stage_linear_d(late(auto), auto.compression.options) == 2
    assert stage_linear_d(auto.schedule[0], auto.compression.options) == 1  # early: never
    kept = _auto_job({"linear_d": 1})
    assert stage_linear_d(late(kept), kept.compression.options) == 1
    given_d = _auto_job(d=1)  # two cores asked for by the user: built and kept as asked
    assert stage_linear_d(late(given_d), given_d.compression.options) == 1
    fixed = _auto_job(max_rank=8)
    assert stage_linear_d(late(fixed), fixed.compression.options) == 1
    plan = automatic_choices(auto)["linear_d"]
    assert plan["stages"] == [1] and plan["value"] == [2] and plan["given"] == [False]
    assert "linear_d" not in (automatic_choices(kept) or {})


def test_a_checkpoint_written_in_two_cores_resumes_in_two_cores(tmp_path):
    """A checkpoint inside a late stage that did not rewrite its layers (written before the
    default existed) continues as it was, bitwise, under the default."""
    kept = _auto_job({"linear_d": 1})
    events: list[dict] = []
    want = Trainer(kept, workdir=tmp_path / "a", callbacks=[FunctionCallback(events.append)])
    want = want.run()
    assert all("refactored" not in e for e in events if e["event"] == "stage_start")
    inside = [
        p
        for p in sorted((tmp_path / "a" / "checkpoints").glob("step-*.safetensors"))
        if EARLY < int(p.stem.split("-")[1]) < EARLY + 12
    ]
    tensors, meta = read_checkpoint(inside[0])
    for stage in meta["job"]["schedule"]:  # as written before the field existed
        stage.pop("linear_d")
    meta.pop("format_version")
    old = save_checkpoint(tmp_path / "old.safetensors", tensors, meta)
    default = _auto_job()  # the same job under today's default: 2 for its late stage
    got = Trainer(default, workdir=tmp_path / "b", resume=old)
    assert got.refactored == {}
    _assert_same_run(want, got.run())
    fresh: list[dict] = []  # and run from the start, the default rewrites
    Trainer(default, workdir=tmp_path / "c", callbacks=[FunctionCallback(fresh.append)]).run()
    start = next(e for e in fresh if e["event"] == "stage_start" and e["stage"] == 1)
    assert set(start["refactored"]) == {"hidden.1"}  # hidden.0 (16 x 64) stays dense: too small


def test_the_default_leaves_the_modes_a_job_gives(tmp_path):
    """Two cores asked for by name (``compression.modes``) stay two cores under the default;
    the layers the engine factored itself are rewritten."""
    events: list[dict] = []
    job = _auto_job(layers=["hidden.*"], modes={"hidden.0": {"in": [16], "out": [64]}})
    Trainer(job, workdir=tmp_path, callbacks=[FunctionCallback(events.append)]).run()
    start = next(e for e in events if e["event"] == "stage_start" and e["stage"] == 1)
    assert set(start["refactored"]) == {"hidden.1"}
