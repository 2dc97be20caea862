"""The memory estimate of a data-parallel job is per process (``worker.memory_estimate``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from worker.plan import plan_job

JOB: dict[str, Any] = {
    "name": "mlp",
    "method": "comera",
    "model": {"arch": "mlp", "config": {"hidden": [256, 256]}},
    "data": {
        "kind": "synthetic",
        "n_train": 512,
        "n_valid": 64,
        "params": {"shape": [16, 16], "num_classes": 4},
    },
    "compression": {"max_rank": 8, "min_size": 16},
    "schedule": [{"kind": "early", "steps": 10}],
    "training": {"batch_size": 64},
}


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
        {"kind": "late", "steps": 10, "target_ratio": 0.5},
        {"kind": "finetune", "steps": 5},
    ]
    off = copy.deepcopy(job)
    off["schedule"][1]["teacher_weight"] = off["schedule"][2]["teacher_weight"] = 0
    with_teacher, without = plan_job(job)["memory"], plan_job(off)["memory"]
    params = without["model_bytes"] // 16  # no frozen parameters in an MLP
    assert with_teacher["model_bytes"] == without["model_bytes"] + 4 * params
    assert with_teacher["activation_bytes"] == without["activation_bytes"] + 2 * 4 * 64 * 256
    unguarded = copy.deepcopy(job)  # the guard off: no teacher unless asked for
    unguarded["compression"]["max_metric_drop"] = None
    assert plan_job(unguarded)["memory"] == without
