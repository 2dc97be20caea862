"""``model.config`` of the ``hf`` workload: what it accepts and how it refuses the rest."""

from __future__ import annotations

import json

import pytest

from engine.configs import ConfigError
from engine.models.hf import HFConfig
from engine.train.job import JobConfig
from tests.helpers.hf_models import tiny_config
from tests.helpers.specs import early_stage, engine_job, model_spec, synthetic_data


def _refused(match: str, **kw) -> None:
    with pytest.raises(ConfigError, match=match):
        HFConfig(**kw)


def test_unknown_model_type_is_refused_naming_the_field():
    _refused(r"hf_config.model_type: model_type must be one of", hf_config={"model_type": "t5"})


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_hidden_layers", 10**9), ("vocab_size", 10**12), ("hidden_size", 0), ("n_layer", True)],
)
def test_sizes_out_of_bounds_are_refused_before_any_build(field, value):
    cfg = {**tiny_config("llama" if field != "n_layer" else "gpt2"), field: value}
    _refused(rf"hf_config.{field}: must be an integer in", hf_config=cfg)


def test_a_task_the_family_lacks_is_refused():
    _refused(
        r"task: 'masked_lm' is not offered for model_type 'gpt2'",
        task="masked_lm",
        hf_config=tiny_config("gpt2"),
    )


def test_exactly_one_start():
    _refused("give exactly one of path", task="causal_lm")
    _refused("give exactly one of path", path="/nonexistent", hf_config=tiny_config("gpt2"))


def test_encoder_decoder_flags_are_refused():
    _refused(
        "encoder-decoder",
        hf_config={**tiny_config("bert"), "add_cross_attention": True},
        task="masked_lm",
    )


def test_code_references_are_dropped(tmp_path):
    cfg = HFConfig(hf_config={**tiny_config("llama"), "auto_map": {"AutoModel": "evil.Model"}})
    assert "auto_map" not in cfg.config_json
    assert "auto_map" not in cfg.portable_dict()["hf_config"]


def test_a_directory_with_pickled_weights_only_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("llama")))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    _refused(r"path: .* has no model.safetensors .*never loaded", path=str(tmp_path))


def test_data_longer_than_the_positions_is_refused():
    _refused(
        r"max_len: data.max_len 65 is longer than the model's 64 positions",
        hf_config=tiny_config("llama"),
        max_len=65,
    )
    _refused(
        r"max_len: .* 64 positions", hf_config=tiny_config("roberta"), task="masked_lm", max_len=65
    )  # 66 positions, 2 taken by the padding offset


def test_a_tokenizer_larger_than_the_vocabulary_is_refused():
    _refused(
        "tokenizer: the tokenizer has 40000 tokens",
        hf_config=tiny_config("llama"),
        tokenizer_vocab_size=40000,
    )


def test_the_job_validates_the_model_config_up_front():
    job = engine_job(
        model=model_spec("hf", {"task": "causal_lm", "hf_config": {"model_type": "x"}}),
        data=synthetic_data(),
        schedule=[early_stage(steps=1)],
    )
    with pytest.raises(ConfigError, match=r"model.config.hf_config.model_type"):
        JobConfig.from_dict(job)


def test_portable_dict_rebuilds_the_same_architecture(tmp_path):
    from tests.helpers.hf_models import make_model_dir

    directory = make_model_dir(tmp_path, "gpt2")
    cfg = HFConfig(path=str(directory))
    again = HFConfig.from_dict(cfg.portable_dict())
    assert again.path is None and again.config_json == cfg.config_json


def test_a_checkpoint_of_a_start_that_needs_the_original_rebuilds_without_it(tmp_path):
    """``init: "sequential"`` and ``rank_allocation: "energy"`` need the pretrained directory;
    a compressed checkpoint's config (the portable dict) has none and must still load."""
    from tests.helpers.hf_models import make_model_dir

    bert = make_model_dir(tmp_path, "bert", task="sentence_embedding")
    llama = make_model_dir(tmp_path, "llama")
    for cfg in (
        HFConfig(path=str(bert), task="sentence_embedding", init="sequential"),
        HFConfig(path=str(llama), rank_allocation="energy"),
    ):
        again = HFConfig.from_dict(cfg.portable_dict())
        assert again.path is None and again.config_json == cfg.config_json
        assert (again.init, again.rank_allocation) == ("whitened", "uniform")
        assert again.task == cfg.task


@pytest.mark.parametrize(
    ("model_type", "task"),
    [
        ("bert", "masked_lm"),
        ("roberta", "sequence_classification"),
        ("distilbert", "sequence_classification"),
        ("gpt2", "causal_lm"),
        ("llama", "causal_lm"),
    ],
)
def test_dropout_sets_every_dropout_of_the_model(model_type, task):
    """``dropout`` reaches every ``nn.Dropout`` transformers builds (and the attention's
    functional dropout); unset, the config.json's own values stay."""
    import torch

    from engine.models.hf import build_hf
    from engine.models.hf.model import auto_class
    from engine.models.tensorize import TensorizeOptions

    config = {**tiny_config(model_type), "num_labels": 3}

    def probabilities(**kw) -> set[float]:
        cfg = HFConfig(hf_config=config, task=task, **kw)
        return of(build_hf(cfg, tensorized=False, options=TensorizeOptions()).net)

    def of(net) -> set[float]:
        ps = {m.p for m in net.modules() if isinstance(m, torch.nn.Dropout)}
        if hasattr(net.config, "attention_dropout"):  # DistilBERT's module, LLaMA's functional
            ps.add(float(net.config.attention_dropout))
        return ps

    assert probabilities(dropout=0.3) == {0.3}
    assert probabilities(dropout=0.0) == {0.0}
    cfg = HFConfig(hf_config=config, task=task)
    plain = auto_class(task).from_config(cfg.transformers_config())  # transformers' own
    assert probabilities() == of(plain)
