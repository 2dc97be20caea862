"""Model directories and config.json: what is accepted, and errors that name the field."""

from __future__ import annotations

import json

import pytest
import safetensors.torch

from engine.models.hf_bert import build_hf_bert
from engine.models.hf_bert.config import HFBertConfig, resolve_model_dir
from engine.models.registry import TensorizeOptions, get_workload
from engine.train import JobConfig
from engine.train.config import ConfigError
from tests.helpers.hf_bert import MINILM, edit_config, minilm_dir, write_tiny_bert
from tests.helpers.specs import early_stage, engine_job, model_spec, synthetic_data


def job(config: dict) -> dict:
    return engine_job(
        model=model_spec("hf_bert", config),
        data=synthetic_data("stdlib_text"),
        schedule=[early_stage(steps=1)],
    )


def test_minilm_config_is_read_from_the_package_directory():
    cfg = HFBertConfig(path=MINILM)
    assert cfg.model_dir == minilm_dir() and (minilm_dir() / "model.safetensors").is_file()
    assert cfg.arch.to_dict() == {
        "vocab_size": 30522,
        "hidden_size": 384,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "intermediate_size": 1536,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    }
    again = get_workload("hf_bert").config_from_dict(cfg.to_dict())
    assert again == cfg
    assert JobConfig.from_dict(job({"path": MINILM})).model_config() == cfg


def test_a_missing_directory_or_file_names_model_config_path(tmp_path):
    with pytest.raises(ConfigError, match="model.config.path: .*is not a directory") as err:
        JobConfig.from_dict(job({"path": str(tmp_path / "nowhere")}))
    assert err.value.field == "model.config.path"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(
        ValueError, match=r"path: .* lacks \['model.safetensors', 'tokenizer.json'\]"
    ):
        HFBertConfig(path=str(tmp_path))
    with pytest.raises(ValueError, match="path: 'pkg:no_such_pkg_xyz/model': no installed"):
        resolve_model_dir("pkg:no_such_pkg_xyz/model")
    with pytest.raises(ValueError, match="path: is required"):
        HFBertConfig()
    with pytest.raises(ConfigError, match="model.config.path: .*config.json as JSON"):
        write_tiny_bert(tmp_path)
        (tmp_path / "config.json").write_text("{not json")
        JobConfig.from_dict(job({"path": str(tmp_path)}))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "roberta"}, 'model_type: must be "bert"'),
        ({"hidden_act": "relu"}, 'hidden_act: must be "gelu"'),
        (
            {"position_embedding_type": "relative_key"},
            'position_embedding_type: must be "absolute"',
        ),
        ({"is_decoder": True}, "is_decoder: must be false"),
        ({"hidden_size": 100_000}, r"hidden_size: must be an integer >= 1 and <= 8192"),
        ({"num_hidden_layers": 0}, r"num_hidden_layers: must be an integer >= 1 and <= 64"),
        ({"num_attention_heads": 5}, "hidden_size: must be divisible by num_attention_heads"),
        ({"layer_norm_eps": 0}, r"layer_norm_eps: must be a finite number > 0 and < 1"),
        ({"intermediate_size": None}, "intermediate_size: is required"),
    ],
)
def test_unsupported_configs_are_rejected_naming_the_field(tmp_path, change, message):
    edit_config(write_tiny_bert(tmp_path), **change)
    with pytest.raises(ValueError, match=f"path: .*config.json: {message}"):
        HFBertConfig(path=str(tmp_path))
    with pytest.raises(ConfigError, match=message) as err:
        JobConfig.from_dict(job({"path": str(tmp_path)}))
    assert err.value.field == "model.config.path"


def test_workload_fields_are_validated():
    for bad, message in [
        ({"distill": "kl"}, "model.config.distill: must be one of"),
        ({"pooling": "cls"}, "model.config.pooling: must be one of"),
        ({"init": "random"}, "model.config.init: must be one of"),
        ({"distill_weight": -1}, "model.config.distill_weight: must be"),
        ({"depth_gain": 0}, "model.config.depth_gain: must be a finite number >= 0.1"),
        ({"depth_gain": 11}, "model.config.depth_gain: must be a finite number >= 0.1"),
        ({"depth_gain": True}, "model.config.depth_gain: must be a finite number"),
        ({"tensorize_embeddings": 1}, "model.config.tensorize_embeddings"),
        ({"teacher": "x"}, "model.config.teacher: unknown field"),
    ]:
        with pytest.raises(ConfigError, match=message):
            JobConfig.from_dict(job({"path": MINILM, **bad}))


def test_the_budget_is_target_compression_and_the_old_name_is_refused_with_a_hint():
    budget = {"path": MINILM, "init": "sequential", "rank_allocation": "sensitivity"}
    JobConfig.from_dict(job({**budget, "target_compression": 5}))
    assert HFBertConfig.from_dict({**budget, "target_compression": 5}).target_compression == 5.0
    for bad, field, message in [
        ({**budget, "target_ratio": 5.0}, "target_ratio", "renamed to target_compression"),
        (budget, "target_compression", "is required with rank_allocation='sensitivity'"),
        ({**budget, "target_compression": 1}, "target_compression", "must be a finite number > 1"),
        ({"path": MINILM, "target_compression": 5}, "target_compression", "needs a budgeted"),
    ]:
        with pytest.raises(ConfigError, match=message) as err:
            JobConfig.from_dict(job(bad))
        assert err.value.field == f"model.config.{field}"
    with pytest.raises(ConfigError, match="target_ratio: renamed to target_compression"):
        HFBertConfig.from_dict({**budget, "target_ratio": 5.0})


def test_architecture_without_path_rebuilds_and_must_match_a_path(tmp_path):
    write_tiny_bert(tmp_path)
    arch = HFBertConfig(path=str(tmp_path)).arch.to_dict()
    assert HFBertConfig(architecture=arch).arch.hidden_size == 32
    with pytest.raises(ValueError, match="architecture: .* does not match"):
        HFBertConfig(path=str(tmp_path), architecture={**arch, "hidden_size": 64})
    with pytest.raises(ValueError, match="architecture.hidden_size: must be divisible"):
        HFBertConfig(architecture={**arch, "num_attention_heads": 5})


def test_weights_that_do_not_match_config_json_are_rejected(tmp_path):
    write_tiny_bert(tmp_path)
    edit_config(tmp_path, num_hidden_layers=3)
    cfg = HFBertConfig(path=str(tmp_path))
    with pytest.raises(ValueError, match="path: .*model.safetensors lacks weights for"):
        build_hf_bert(cfg, tensorized=False, options=TensorizeOptions())
    edit_config(tmp_path, num_hidden_layers=2)
    weights = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    weights["encoder.layer.0.attention.self.rotary.weight"] = weights["pooler.dense.weight"].clone()
    safetensors.torch.save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        ValueError,
        match="'encoder.layer.0.attention.self.rotary.weight', which is not a BERT encoder weight",
    ):
        build_hf_bert(cfg, tensorized=False, options=TensorizeOptions())


def test_the_example_config_parses_and_resolves_the_package_path():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "engine" / "minilm_hf.json"
    job_config = JobConfig.from_dict(json.loads(path.read_text()))
    assert job_config.model.arch == "hf_bert"
    assert job_config.model_config().model_dir == minilm_dir()
