"""build_data: the batch contract of each architecture, model fields, argument errors."""

from __future__ import annotations

import pytest
import torch

from engine.data import DataConfig, build_data, write_synthetic
from engine.models.transformer import TransformerConfig, build_transformer

CONTRACT = {
    "transformer": {
        "input_ids": torch.long,
        "token_type_ids": torch.long,
        "attention_mask": torch.bool,
        "labels": torch.long,
    },
    "dlrm": {"dense": torch.float32, "sparse": torch.long, "labels": torch.float32},
    "mlm": {"input_ids": torch.long, "attention_mask": torch.bool, "labels": torch.long},
    "mlp": {"x": torch.float32, "labels": torch.long},
}
OVERRIDES = {
    "transformer": {"vocab_size", "num_classes", "max_len"},
    "dlrm": {"n_dense", "table_sizes"},
    "mlm": {"vocab_size", "max_len"},
    "mlp": {"in_features", "num_classes"},
}


@pytest.mark.parametrize("arch", sorted(CONTRACT))
def test_synthetic_batches_follow_the_contract(tmp_path, arch):
    cfg = DataConfig(n_train=50, n_valid=10, max_len=16, num_rows=500, vocab_size=200)
    b = build_data(cfg, arch=arch, batch_size=8, seed=0, workdir=tmp_path)
    assert set(b.model_overrides) == OVERRIDES[arch]
    n = b.train.num_examples()  # sequences for mlm (packed lines), rows otherwise
    assert n == 50 or arch == "mlm"
    assert b.train.num_batches() == -(-n // 8) and b.valid.num_batches() >= 1
    batches = list(b.train.batches(0))
    sizes = [8] * (n // 8) + ([n % 8] if n % 8 else [])
    assert [len(x["labels"]) for x in batches] == sizes  # the last partial batch is kept
    for x in batches:
        assert {k: v.dtype for k, v in x.items()} == CONTRACT[arch]
        n = len(x["labels"])
        assert all(v.shape[0] == n for v in x.values())
    x = batches[0]
    o = b.model_overrides
    if arch == "transformer":
        assert x["input_ids"].shape[1] <= 16 and int(x["input_ids"].max()) < o["vocab_size"]
        assert int(x["labels"].max()) < o["num_classes"]
        assert x["input_ids"][:, 0].unique().numel() == 1  # [CLS]
    elif arch == "dlrm":
        assert x["dense"].shape[1] == 13 and x["sparse"].shape[1] == 26
        assert (x["sparse"] < torch.tensor(o["table_sizes"])).all() and (x["dense"] >= 0).all()
    elif arch == "mlm":
        assert x["labels"].shape == x["input_ids"].shape
        assert int(x["input_ids"].max()) < o["vocab_size"]
    else:
        assert x["x"].shape[1] == o["in_features"] and int(x["labels"].max()) < o["num_classes"]


def test_transformer_runs_on_a_batch_with_the_data_fields(tmp_path):
    b = build_data(
        DataConfig(n_train=20, n_valid=0, max_len=24), arch="transformer", batch_size=5, seed=0
    )
    assert b.valid is None
    model = build_transformer(TransformerConfig.tiny(**b.model_overrides), tensorized=False)
    x = next(b.train.batches(0))
    logits = model(x["input_ids"], x["token_type_ids"], x["attention_mask"])
    assert logits.shape == (5, b.model_overrides["num_classes"])


def test_resume_mid_epoch_replays_exactly(tmp_path):
    files = write_synthetic("mlm", tmp_path / "f", n_train=200, seed=0)
    cfg = files.config(max_len=32, shuffle_buffer=16, vocab_size=200)
    b = build_data(cfg, arch="mlm", batch_size=4, seed=7, workdir=tmp_path / "w")
    full = list(b.train.batches(3))
    again = build_data(cfg, arch="mlm", batch_size=4, seed=7, workdir=tmp_path / "w")  # "resumed"
    assert again.info["tokenizer"] == "reused"
    for x, y in zip(full[5:], again.train.batches(3, start=5), strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize(
    "cfg,arch,match",
    [
        (DataConfig(kind="criteo", train="x.tsv"), "mlp", "data.kind: 'criteo' feeds model.arch"),
        (DataConfig(generator="criteo"), "mlp", "data.generator: 'criteo' makes data"),
        (DataConfig(), "gpt", "model.arch"),
        (DataConfig(kind="npz", train="/nonexistent.npz"), "mlp", "data.train: no such file"),
        (
            DataConfig(kind="text", train=__file__, tokenizer="/none.json"),
            "mlm",
            "data.tokenizer: no such file",
        ),
        (DataConfig(params={"bogus": 1}), "mlp", "data.params.bogus: unknown parameter"),
    ],
)
def test_argument_errors_name_the_field(cfg, arch, match):
    with pytest.raises(ValueError, match=match):
        build_data(cfg, arch=arch, batch_size=2, seed=0)


def test_batch_size_is_checked():
    with pytest.raises(ValueError, match="batch_size"):
        build_data(DataConfig(), arch="mlp", batch_size=0, seed=0)


def test_the_kind_registry_is_the_configs_choice_list():
    from engine.data import ARCH_OF_KIND, ARCHS, DATA_KINDS, OTHER_ARCHS_OF_KIND, register_kind
    from engine.data.config import KINDS

    assert list(DATA_KINDS) == [*KINDS[1:], "synthetic"] and set(KINDS) == set(DATA_KINDS)
    assert DATA_KINDS["synthetic"].archs == ARCHS
    assert ARCH_OF_KIND == {
        "jsonl": "transformer",
        "csv": "transformer",
        "criteo": "dlrm",
        "text": "mlm",
        "npz": "mlp",
    }
    assert OTHER_ARCHS_OF_KIND == {"text": ("hf_bert", "hf"), "jsonl": ("hf",), "csv": ("hf",)}
    with pytest.raises(ValueError, match="already registered"):
        register_kind("npz", archs=("mlp",))(lambda config, load: None)
    assert DATA_KINDS["npz"].archs == ("mlp",)
