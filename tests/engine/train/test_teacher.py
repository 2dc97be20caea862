"""The stage-start teacher (:mod:`engine.train.teacher`): a frozen copy of the model at the
late stage's start, run without a graph in eval mode, distils into the shrinking model; its
weights ride in the checkpoints, so a resumed run is bitwise the uninterrupted one; the job
configs without the new fields still validate and old checkpoints still resume."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from api_schemas import JobCreate
from engine.models.registry import build_model, get_workload
from engine.train import FunctionCallback, JobConfig, Trainer
from engine.train.checkpoint import read_checkpoint
from engine.train.config import ConfigError
from engine.train.resume import check_compatible
from engine.train.state import TrainState
from engine.train.teacher import StageTeacher, distill_kl, teacher_output, teacher_weight
from tests.engine.train.test_rank_control import LR, mlp_job
from tests.engine.train.test_trainer import _assert_same_run
from tests.helpers.specs import engine_job, mlp_model, stages, synthetic_data

ROOT = Path(__file__).resolve().parents[3]
EARLY = 30


def _job(**changes):
    return mlp_job(
        {"kind": "early", "steps": EARLY, "lr": LR},
        {"kind": "late", "steps": 20, "target_ratio": 0.4, "lr": LR, "teacher_weight": 1.0},
        {"kind": "finetune", "steps": 6, "teacher_weight": 1.0},
        checkpoint={"every_steps": 3, "keep": 20},
        compression={"max_metric_drop": 10.0},
        **changes,
    )


def test_the_kl_term_is_zero_when_student_equals_teacher():
    z = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)  # (B, C)
    for temperature in (1.0, 2.0, 4.0):
        kd = distill_kl(z, z.detach(), temperature, "classes")
        assert kd.item() == 0.0
        (grad,) = torch.autograd.grad(kd, z)
        assert grad.abs().max() < 1e-15  # rounding only: no pull at all
    b = torch.randn(8)  # (B,) binary logits
    assert distill_kl(b, b, 2.0, "binary").item() == 0.0
    assert distill_kl(z, z.detach() + 1.0, 2.0, "classes").item() == pytest.approx(0.0, abs=1e-12)
    assert distill_kl(z, -z.detach(), 2.0, "classes").item() > 0  # apart: positive


def test_the_teacher_is_the_frozen_stage_start_model():
    torch.manual_seed(0)
    workload = get_workload("mlp")
    model = build_model(
        "mlp", {"in_features": 16, "hidden": [32], "num_classes": 4}, tensorized=True
    )
    batch = workload.example_batch({"in_features": 16, "hidden": [32], "num_classes": 4}, 8)
    frozen = copy.deepcopy(model).eval()
    teacher = StageTeacher.copy_of(model, teacher_output(workload))
    with torch.no_grad():  # the student moves on
        for p in model.parameters():
            p.add_(0.1)
    want = frozen(batch["x"])  # (B, C)
    got = teacher.logits(batch["x"])
    assert torch.equal(got, want) and not got.requires_grad
    assert not teacher.model.training
    assert not any(p.requires_grad for p in teacher.model.parameters())
    # the watch records the student's call; the KL of a student equal to it is zero
    student = copy.deepcopy(frozen)
    with teacher.watch(student) as seen:
        out = student(batch["x"])
    assert seen.output is out and seen.args[0] is batch["x"]
    assert teacher.loss(seen, 2.0).item() == 0.0
    assert not student._forward_hooks  # the watch is gone


def test_defaults_and_opt_out():
    stage = JobConfig.from_dict(
        engine_job(
            model=mlp_model(),
            data=synthetic_data(params={"shape": [4], "num_classes": 2}),
            schedule=stages(
                early={"steps": 1},
                late={"steps": 1, "target_ratio": 0.5},
                finetune={"steps": 1, "teacher_weight": 0.5},
            ),
        )
    ).schedule
    mlp, bert = get_workload("mlp"), get_workload("hf_bert")
    assert [teacher_weight(s, mlp, True) for s in stage] == [0.0, 0.0, 0.5]  # opt-in
    assert [teacher_weight(s, mlp, False) for s in stage] == [0.0, 0.0, 0.5]  # guard off
    assert [teacher_weight(s, bert, True) for s in stage] == [0.0, 0.0, 0.0]  # not logits
    assert teacher_output(get_workload("dlrm")) == "binary"
    with pytest.raises(ConfigError, match="teacher_weight"):
        mlp_job({"kind": "early", "steps": 3, "teacher_weight": 1.0})
    with pytest.raises(ConfigError, match="teacher_temperature"):
        mlp_job({"kind": "late", "steps": 3, "target_ratio": 0.5, "teacher_temperature": 0})


def test_job_configs_without_the_new_fields_still_validate():
    for path in [
        *sorted((ROOT / "examples" / "engine").glob("*.json")),
        ROOT / "examples" / "service" / "nli_job.json",
    ]:
        spec = json.loads(path.read_text())
        if "dataset" in spec:  # a service submission: the wire schema reads it
            stages = JobCreate.model_validate(spec).schedule
        else:
            stages = JobConfig.from_dict(spec).schedule
        for stage in stages:
            assert stage.teacher_weight is None and stage.teacher_temperature == 2.0
    # a checkpoint written before the fields existed continues the same job
    job = _job().to_dict()
    for stage in job["schedule"]:
        stage["teacher_weight"] = None  # as a config that leaves it at its default
    old = copy.deepcopy(job)
    for stage in old["schedule"]:
        del stage["teacher_weight"], stage["teacher_temperature"]
    check_compatible(old, job, TrainState(stage=1, stage_started=True), Path("old.safetensors"))


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher")
    events: list[dict] = []
    job = _job()
    trainer = Trainer(job, workdir=path, callbacks=[FunctionCallback(events.append)])
    result = trainer.run()
    return job, path, trainer, result, events


def test_the_late_stage_distils_from_its_start(distilled):
    job, path, trainer, result, events = distilled
    steps = [e for e in events if e["event"] == "step"]
    assert all("distill" not in e for e in steps if e["stage"] == 0)
    assert any(e.get("distill", 0) > 0 for e in steps if e["stage"] == 1)
    assert any("distill" in e for e in steps if e["stage"] == 2)  # the finetune after it
    # the teacher's logits are the stage-start model's: the checkpoint at the early stage's end
    start = Trainer(
        job, workdir=path / "probe", resume=path / "checkpoints" / f"step-{EARLY:08d}.safetensors"
    )
    batch = next(iter(trainer.data.valid.batches(0)))
    start.model.eval()
    with torch.no_grad():
        want = start.model(batch["x"])  # (B, C)
    assert torch.equal(trainer.teacher.logits(batch["x"]), want)
    tensors, _ = read_checkpoint(path / "checkpoints" / "final.safetensors")
    assert any(k.startswith("teacher/model/") for k in tensors)


def test_resume_with_a_teacher_is_bitwise(distilled):
    job, path, _, result, _ = distilled
    ckpts = sorted((path / "checkpoints").glob("step-*.safetensors"))
    inside = [p for p in ckpts if EARLY < int(p.stem.split("-")[1]) < EARLY + 26]
    assert inside
    for ckpt in (inside[0], inside[-1]):  # in the late stage and in the finetune after it
        _assert_same_run(result, Trainer(job, workdir=path / "again", resume=ckpt).run())


def test_a_bf16_fast_path_job_distils_too(tmp_path):
    """The teacher runs in float32 beside a bf16 student (its frozen copy has no fast-path
    session; the eager TT contraction refused bf16 autocast and the job failed)."""
    events: list[dict] = []
    job = _job(training={"precision": "bf16", "fast_path": True})
    Trainer(job, workdir=tmp_path, callbacks=[FunctionCallback(events.append)]).run()
    late = [e for e in events if e["event"] == "step" and e["stage"] == 1]
    assert late and all(math.isfinite(e["distill"]) for e in late)
