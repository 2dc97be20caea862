"""DataConfig: round trip, unknown keys, and error messages that name data.<field>."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.configs import ConfigError
from engine.data import DataConfig


def test_round_trip_through_json():
    cfg = DataConfig(
        kind="criteo",
        train="t.tsv",
        valid="v.tsv",
        num_rows=list(range(2, 28)),
        labels=None,
        shuffle_buffer=5,
        params={"a": 1},
    )
    data = json.loads(json.dumps(cfg.to_dict()))
    assert DataConfig.from_dict(data) == cfg and data["version"] == 1
    assert cfg.table_rows() == tuple(range(2, 28))
    assert DataConfig(num_rows=7).table_rows() == (7,) * 26
    cfg = DataConfig(kind="jsonl", train=Path("x.jsonl"), labels=["b", 3])
    assert cfg.train == "x.jsonl" and cfg.labels == ("b", "3")
    assert DataConfig.from_dict(cfg.to_dict()) == cfg
    assert DataConfig.from_dict({}) == DataConfig()


def test_unknown_keys_are_rejected():
    with pytest.raises(ValueError, match=r"^data\.shuffle: unknown field"):
        DataConfig.from_dict({"shuffle": 3})


BAD = [
    ({"kind": "parquet"}, "data.kind"),
    ({"kind": "jsonl"}, "data.train: is required"),
    ({"train": "x"}, "data.train: must be null for kind 'synthetic'"),
    ({"kind": "csv", "train": ""}, "data.train: must be a string of 1-4096"),
    ({"kind": "csv", "train": "x", "valid": "y", "valid_every": 3}, "data.valid_every"),
    ({"kind": "csv", "train": "x", "valid_every": 1}, "data.valid_every"),
    ({"valid_every": 2}, "data.valid_every: must be 0 for kind 'synthetic'"),
    ({"shuffle_buffer": -1}, "data.shuffle_buffer"),
    ({"length_buckets": -1}, "data.length_buckets"),
    ({"length_buckets": 1025}, "data.length_buckets: must be an integer >= 0 and <= 1024"),
    ({"kind": "criteo", "train": "x", "length_buckets": 4}, "data.length_buckets: only"),
    ({"generator": "mlp", "length_buckets": 4}, "data.length_buckets: only"),
    ({"drop_last": 1}, "data.drop_last"),
    ({"text_a": ""}, "data.text_a"),
    ({"text_b": 3}, "data.text_b"),
    ({"label_field": None}, "data.label_field"),
    ({"labels": []}, "data.labels"),
    ({"labels": "abc"}, "data.labels"),
    ({"labels": ["a", "a"]}, "data.labels: must be distinct"),
    ({"labels": ["a", 1.5]}, "data.labels: entries"),
    ({"vocab_size": 10}, "data.vocab_size"),
    ({"max_len": 3}, "data.max_len: must be an integer >= 8 and <= 2048, got 3"),
    ({"max_len": True}, "data.max_len"),
    ({"num_rows": 0}, "data.num_rows"),
    ({"num_rows": [5, 5]}, "data.num_rows"),
    ({"mlm_probability": 1.0}, "data.mlm_probability"),
    ({"generator": "gan"}, "data.generator"),
    ({"n_train": 0}, "data.n_train"),
    ({"n_valid": -1}, "data.n_valid"),
    ({"synthetic_seed": -1}, "data.synthetic_seed"),
    ({"params": [1]}, "data.params"),
    ({"version": 2}, "data.version"),
]


@pytest.mark.parametrize("changes,match", BAD)
def test_invalid_fields_are_named(changes, match):
    with pytest.raises(ConfigError, match="^" + match.replace(".", r"\.")):
        DataConfig.from_dict(changes)
    field = match.split(":")[0].split(" ")[0]
    with pytest.raises(ConfigError) as err:  # built directly: the field relative to data
        DataConfig(**changes)
    assert "data." + err.value.field == field
