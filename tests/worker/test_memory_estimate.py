"""The memory estimate (``worker.memory_estimate``): per process for a data-parallel job, each
process's baseline and the launcher beside them, a pretrained model's frozen teacher."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.models.registry import get_workload
from engine.train.auto_rank import AUTO_RANK_CAP
from engine.train.job import JobConfig
from tests.helpers.hf_dirs import SIZES, write_bert_dir
from tests.helpers.specs import (
    early_stage,
    engine_job,
    mlp_model,
    model_spec,
    synthetic_data,
    text_data,
)
from worker.memory_estimate import FRAGMENTATION, RUNTIME_SLACK, estimate_memory
from worker.plan import plan_job
from worker.process_baseline import DEFAULT_BASELINE, ENV, ProcessBaseline, known_baseline

JOB: dict[str, Any] = engine_job(
    name="mlp",
    method="comera",
    model=mlp_model(256, 256),
    data=synthetic_data(n_train=512, n_valid=64, params={"shape": [16, 16], "num_classes": 4}),
    compression={"max_rank": 8, "min_size": 16},
    schedule=[early_stage(steps=10)],
    training={"batch_size": 64},
)


def _job(devices: int = 1, nodes: int = 1) -> dict[str, Any]:
    job = copy.deepcopy(JOB)
    job["training"].update(devices=devices, nodes=nodes)
    return job


def test_each_process_holds_the_model_its_rows_and_the_data():
    one = plan_job(_job())["memory"]
    two = plan_job(_job(devices=2))["memory"]
    four = plan_job(_job(devices=2, nodes=2))["memory"]
    assert (one["processes"], two["processes"], four["processes"]) == (1, 2, 4)
    assert two["activation_bytes"] * 2 == one["activation_bytes"]  # half the global batch
    assert four["activation_bytes"] * 4 == one["activation_bytes"]
    trainable = (one["model_bytes"]) // 16  # no frozen parameters in an MLP
    assert two["model_bytes"] == one["model_bytes"] + 4 * trainable  # DDP's gradient buckets
    assert two["data_bytes"] == one["data_bytes"]  # every process builds the global batches


def test_the_capacity_is_checked_per_process():
    need = plan_job(_job(devices=2))["estimated_memory_bytes"]
    plan_job(_job(devices=2), capacity_bytes=need)  # fits each process
    with pytest.raises(ValueError) as err:  # the SpecError naming the largest part
        plan_job(_job(devices=2), capacity_bytes=need - 1)
    assert "each of the job's 2 processes needs" in err.value.message
    assert "a worker offers each process" in err.value.message


def test_the_stage_start_teacher_is_counted():
    """A late stage distils from a frozen copy of the model at its start
    (``engine.train.teacher``): 4 bytes per parameter and its forward's widest layer."""
    job = _job()
    job["schedule"] = [
        {"kind": "early", "steps": 10},
        {"kind": "late", "steps": 10, "target_ratio": 0.5, "teacher_weight": 1.0},
        {"kind": "finetune", "steps": 5, "teacher_weight": 1.0},
    ]
    off = copy.deepcopy(job)  # the default: no teacher
    del off["schedule"][1]["teacher_weight"], off["schedule"][2]["teacher_weight"]
    with_teacher, without = plan_job(job)["memory"], plan_job(off)["memory"]
    unguarded = copy.deepcopy(off)  # the guard off as well
    unguarded["compression"]["max_metric_drop"] = None
    bare = plan_job(unguarded)["memory"]
    params = bare["model_bytes"] // 16  # no frozen parameters in an MLP
    assert with_teacher["model_bytes"] == without["model_bytes"] + 4 * params
    assert with_teacher["activation_bytes"] == without["activation_bytes"] + 2 * 4 * 64 * 256
    # the guard's two snapshots of the model and Adam's moments (engine.train.guard)
    assert without["model_bytes"] == bare["model_bytes"] + 2 * (4 + 8) * params
    same = ("activation_bytes", "data_bytes", "baseline_bytes", "processes", "launcher_bytes")
    assert all(bare[k] == without[k] for k in same)


BASELINE = ProcessBaseline(process_bytes=300 << 20, hf_bytes=70 << 20, launcher_bytes=200 << 20)


def test_every_process_counts_the_baseline_and_a_job_on_two_devices_its_launcher():
    one = plan_job(_job(), baseline=BASELINE)["memory"]
    two = plan_job(_job(devices=2), baseline=BASELINE)["memory"]
    assert one["baseline_bytes"] == two["baseline_bytes"] == 300 << 20
    tensors = sum(one[k] for k in ("model_bytes", "activation_bytes", "data_bytes"))
    assert one["slack_bytes"] == RUNTIME_SLACK + int(FRAGMENTATION * tensors)
    assert (one["launcher_bytes"], two["launcher_bytes"]) == (0, (200 << 20) + RUNTIME_SLACK)
    plan = plan_job(_job(devices=2), baseline=BASELINE)  # the total is one process's
    parts = ("model_bytes", "activation_bytes", "data_bytes", "baseline_bytes", "slack_bytes")
    assert plan["estimated_memory_bytes"] == sum(plan["memory"][k] for k in parts)


def test_without_a_measured_baseline_the_planner_uses_the_workers_or_the_default(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert known_baseline() == DEFAULT_BASELINE
    default = plan_job(_job())["memory"]["baseline_bytes"]
    assert default == DEFAULT_BASELINE.process_bytes
    monkeypatch.setenv(ENV, json.dumps(BASELINE.to_dict()))  # as the worker exports it
    assert known_baseline() == BASELINE
    assert plan_job(_job())["memory"]["baseline_bytes"] == 300 << 20


def _hf_bert_job(tmp_path: Path, **config: Any) -> dict[str, Any]:
    text = tmp_path / "train.txt"
    text.write_text("one short sentence\nand another one\n" * 8)
    return engine_job(
        name="bert",
        method="comera",
        model=model_spec("hf_bert", {"path": str(tmp_path / "bert"), **config}),
        data=text_data(text, valid_every=4, max_len=16),
        compression={"max_rank": 4},
        schedule=[early_stage(steps=10)],
        training={"batch_size": 8},
    )


def test_hf_bert_counts_its_frozen_original_and_its_inference_forward(tmp_path):
    """The teacher of a pretrained ``hf_bert`` model: float32 and frozen (4 bytes a parameter,
    the dense model's), its forward one layer's input and output and one layer's scores."""
    write_bert_dir(tmp_path / "bert")
    plan = plan_job(_hf_bert_job(tmp_path, distill="mse_hidden"), baseline=BASELINE)
    assert plan["teacher_params"] == plan["params_before"]
    cfg = JobConfig.from_dict(_hf_bert_job(tmp_path, distill="mse_hidden"))
    model_config = cfg.model_config({})
    workload = get_workload("hf_bert")
    with torch.device("meta"):
        model = workload.build(
            workload.plan_config(model_config), tensorized=True, options=cfg.compression.options
        )
    bare = estimate_memory(model, cfg, model_config, 0, baseline=BASELINE)
    memory = plan["memory"]
    assert memory["model_bytes"] == bare.model_bytes + 4 * plan["params_before"]
    heads, seq, widest = SIZES["num_attention_heads"], 16, SIZES["intermediate_size"]
    forward = 2 * 4 * 8 * seq * widest + 4 * 8 * heads * seq * seq
    assert memory["activation_bytes"] == bare.activation_bytes + forward
    # cosine_embedding: the teacher's table of the training split's embeddings, 4 B x hidden
    table = plan_job(_hf_bert_job(tmp_path), baseline=BASELINE)["memory"]["data_bytes"]
    assert table > memory["data_bytes"]


def test_max_rank_auto_is_planned_at_the_cap_with_the_calibration_phase_counted():
    """``max_rank: "auto"``: the layers at the cap (``AUTO_RANK_CAP``), each TT linear of two
    cores (no ``d`` given), the larger of the dense twin's training (weights, gradients, two
    AdamW moments: 16 B a parameter) and the TT model's counted, and the rule stated; a fixed rank
    states nothing and plans the TT model alone, its linears at the cores their size gives."""
    job = _job()
    job["compression"]["max_rank"] = "auto"
    job["schedule"] = [early_stage(steps=40, target_ratio=0.5)]
    plan = plan_job(job)
    assert all(max(layer["initial_ranks"]) <= AUTO_RANK_CAP for layer in plan["layers"])
    assert max(max(layer["initial_ranks"]) for layer in plan["layers"]) > 8
    assert all(len(layer["initial_ranks"]) == 3 for layer in plan["layers"])  # two cores
    # the larger phase: the dense twin's training (no frozen weights) or the TT model's,
    # which at the cap has more parameters than this MLP's dense layers
    at_cap = _job()
    at_cap["compression"].update(max_rank=AUTO_RANK_CAP, d=1)
    at_cap["schedule"] = job["schedule"]
    tt_bytes = plan_job(at_cap)["memory"]["model_bytes"]
    assert plan["memory"]["model_bytes"] == max(16 * plan["params_before"], tt_bytes)
    assert tt_bytes > 16 * plan["params_before"]
    wide = copy.deepcopy(job)  # a 1024 x 1024 layer: the dense twin's phase is the larger
    wide["model"] = mlp_model(1024, 1024)
    wide_plan = plan_job(wide)
    assert wide_plan["memory"]["model_bytes"] == 16 * wide_plan["params_before"]
    auto = plan["automatic"]
    assert auto["max_rank"]["calibration_steps"] == 40  # min(100, the first stage's steps)
    assert (auto["max_rank"]["cap"], auto["max_rank"]["planned_at"]) == (AUTO_RANK_CAP,) * 2
    assert auto["max_rank"]["linear_d"] == 1 and "two cores" in auto["max_rank"]["rule"]
    assert auto["gamma"]["stages"] == [0]  # a target and no gamma: "auto"
    fixed = plan_job(_job())
    assert fixed["automatic"] is None
    assert fixed["memory"]["model_bytes"] < 16 * fixed["params_before"]
    assert any(len(layer["initial_ranks"]) > 3 for layer in fixed["layers"])


def test_an_hf_sentence_encoder_plans_its_teacher_table_unless_it_distils_every_token(tmp_path):
    """``hf``'s ``sentence_embedding`` builds the same table as ``hf_bert``: 4 B x hidden a
    training sentence; with ``token_weight`` the teacher runs every step and there is none."""
    from tests.helpers.hf_models import make_model_dir

    directory = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    text = tmp_path / "train.txt"
    text.write_text("one short sentence\nand another one\n" * 8)

    def data_bytes(**config: Any) -> int:
        spec = engine_job(
            name="encoder",
            method="comera",
            model=model_spec(
                "hf", {"task": "sentence_embedding", "path": str(directory), **config}
            ),
            data=text_data(text, valid_every=4, max_len=16),
            compression={"max_rank": 4},
            schedule=[early_stage(steps=10)],
            training={"batch_size": 8},
        )
        return plan_job(spec, baseline=BASELINE)["memory"]["data_bytes"]

    from engine.models.hf_bert.cache import MAX_BYTES

    # a text file's sentences are not counted when planning: the table's bound, as hf_bert's
    assert data_bytes() - data_bytes(token_weight=1.0) == MAX_BYTES
