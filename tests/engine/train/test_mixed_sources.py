"""A job distilled on a mix of text sources reports each stage's metrics per source of its
validation sentences, and the parts add up to the whole."""

from __future__ import annotations

import pytest

from engine.models.hf_bert.cache import sentence_keys
from engine.train.job import JobConfig
from engine.train.trainer import Trainer
from tests.helpers.hf_models import make_model_dir
from tests.helpers.specs import engine_job, finetune_stage, model_spec, synthetic_data


def test_each_source_of_a_mixed_validation_split_is_reported_and_they_add_up(tmp_path):
    directory = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    spec = engine_job(
        model=model_spec(
            "hf", {"task": "sentence_embedding", "path": str(directory), "dropout": 0.0}
        ),
        data=synthetic_data(
            "stdlib_text",
            n_train=48,
            n_valid=160,
            max_len=32,
            params={"source": "jokes", "also": ["reference"]},
        ),
        compression={"max_rank": 2, "min_size": 1, "d": 1},
        schedule=[finetune_stage(steps=3)],
        training={"batch_size": 16, "seed": 0},
    )
    trainer = Trainer(JobConfig.from_dict(spec), workdir=tmp_path / "run")
    counts = trainer.data.info["valid_examples_per_source"]
    assert set(counts) == {"jokes", "reference"} and sum(counts.values()) == 160
    assert trainer.data.info["synthetic"]["pool_per_source"]["jokes"] > 250
    report = trainer.run().report
    stage = report["stages"][-1]
    parts, whole = stage["metrics_by_source"], stage["metrics"]
    assert set(parts) == {"jokes", "reference"}
    # the whole split's mean cosine is the parts' weighted by their sentence counts
    mean = sum(counts[k] * parts[k]["cosine"] for k in parts) / 160
    assert mean == pytest.approx(whole["cosine"], rel=1e-5)
    # the parts are the whole split's rows, each row in the part of its source
    keys = {k: _keys(trainer.data.valid_parts[k]) for k in parts}
    assert {k: len(v) for k, v in keys.items()} == counts
    assert keys["jokes"].isdisjoint(keys["reference"])
    assert keys["jokes"] | keys["reference"] == _keys(trainer.data.valid)


def _keys(source) -> set[bytes]:
    out = set()
    for batch in source.batches(0):
        out |= set(sentence_keys(batch["input_ids"], batch["attention_mask"], None))
    return out


def test_a_single_source_has_no_parts(tmp_path):
    directory = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    spec = engine_job(
        model=model_spec("hf", {"task": "sentence_embedding", "path": str(directory)}),
        data=synthetic_data(
            "stdlib_text", n_train=16, n_valid=16, max_len=32, params={"source": "jokes"}
        ),
        compression={"max_rank": 4, "min_size": 256},
        schedule=[finetune_stage(steps=1)],
        training={"batch_size": 16, "seed": 0},
    )
    trainer = Trainer(JobConfig.from_dict(spec), workdir=tmp_path / "run")
    assert trainer.data.valid_parts == {}
    assert "metrics_by_source" not in trainer.run().report["stages"][-1]
