"""Job config validation: every bad input names its field; good configs round-trip."""

from __future__ import annotations

import copy

import pytest

from engine.train.config import ConfigError
from engine.train.job import JobConfig
from tests.helpers.specs import engine_job, stages, synthetic_data, transformer_model

BASE = engine_job(
    name="t",
    method="comera",
    model=transformer_model(max_len=32),
    data=synthetic_data("nli"),
    compression={"max_rank": 4, "penalty": "uniform"},
    schedule=stages(
        early={"steps": 5}, late={"steps": 5, "target_ratio": 0.5}, finetune={"steps": 2}
    ),
    training={"batch_size": 8, "seed": 3},
    galore={"rank": 8},
    checkpoint={"keep": 3},
)


def _with(path: str, value):
    cfg = copy.deepcopy(BASE)
    node = cfg
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    elif value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return cfg


_DELETE = object()


def test_round_trip():
    job = JobConfig.from_dict(BASE)
    again = JobConfig.from_dict(job.to_dict())
    assert again == job
    assert job.schedule[1].target_ratio == 0.5 and job.compression.penalty == "uniform"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("model.arch", "resnet", "model.arch"),
        ("schedule.0.kind", "warmup", "schedule[0].kind"),
        ("method", "lte", "method"),
        ("schedule.1.target_ratio", _DELETE, "schedule[1].target_ratio"),
        ("schedule.1.target_ratio", 1.5, "schedule[1].target_ratio"),
        ("schedule.0.target_ratio", 1.0, "schedule[0].target_ratio"),
        ("schedule.0.steps", 0, "schedule[0].steps"),
        ("schedule.0.epochs", 2, "schedule[0]"),  # both epochs and steps
        ("schedule.0.gamma", -1.0, "schedule[0].gamma"),
        ("schedule.0.lr", {"cores": "fast"}, "schedule[0].lr.cores"),
        ("schedule.0.colour", 1, "schedule[0].colour"),
        ("schedule", [], "schedule"),
        ("training.batch_size", 0, "training.batch_size"),
        ("training.device", "tpu", "training.device"),
        ("training.speed", 1, "training.speed"),
        ("compression.penalty", "l2", "compression.penalty"),
        ("compression.max_rank", 0, "compression.max_rank"),
        ("compression.shapes", "square", "compression.shapes"),
        ("compression.wat", 1, "compression.wat"),
        ("galore.rank", 0, "galore.rank"),
        ("checkpoint.keep", 0, "checkpoint.keep"),
        ("version", 9, "version"),
        ("model.config", {"d_model": -4}, "model.config.d_model"),
        ("model.config", {"colour": 1}, "model.config.colour"),
    ],
)
def test_bad_fields_are_named(path, value, field):
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(_with(path, value))
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(field)


def test_an_early_target_takes_auto_gamma_unless_a_fixed_one_is_given():
    job = JobConfig.from_dict(_with("schedule.0.target_ratio", 0.5))
    assert job.schedule[0].gamma == "auto" and job.schedule[2].gamma == 0.01
    cfg = _with("schedule.0.target_ratio", 0.5)
    cfg["schedule"][0]["gamma"] = 0.01
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(cfg)
    assert info.value.field == "schedule[0].target_ratio"


def test_late_stage_needs_comera():
    cfg = _with("method", "dense")
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(cfg)
    assert info.value.field == "schedule[1].kind"
    assert "comera" in str(info.value)


def test_bad_data_field_is_named():
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(_with("data.kind", "parquet"))
    assert info.value.field == "data.kind"


@pytest.mark.parametrize("missing", ["model", "data", "schedule"])
def test_required_sections(missing):
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(_with(missing, _DELETE))
    assert info.value.field == missing


def test_total_steps_sums_the_stages_with_an_auto_stage_at_its_bound():
    cfg = copy.deepcopy(BASE)
    cfg["schedule"][0] = {"kind": "early", "epochs": 3}
    cfg["schedule"][1] = {"kind": "late", "steps": "auto", "max_steps": 40, "target_ratio": 0.5}
    job = JobConfig.from_dict(cfg)
    assert [s.length(7) for s in job.schedule] == [21, 40, 2]
    assert job.total_steps(7) == 21 + 40 + 2
    assert job.total_steps(None) is None  # an epoch stage of unknown length
    assert JobConfig.from_dict(BASE).total_steps(None) == 5 + 5 + 2
