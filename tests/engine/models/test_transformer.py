"""The paper's encoder classifier: exact MNLI counts, forward/backward, padding, determinism."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.compress import CompressConfig, compress_
from engine.models.tensorize import TensorizeOptions
from engine.models.transformer import (
    TransformerConfig,
    build_transformer,
    parameter_report,
)
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from tests.helpers.assertions import assert_close_rel

ENCODER_LINEARS = ("attn.q", "attn.k", "attn.v", "attn.out", "ffn.fc1", "ffn.fc2")


@pytest.fixture(scope="module")
def mnli_tt():
    torch.manual_seed(0)
    return build_transformer(
        TransformerConfig.mnli(),
        tensorized=True,
        options=TensorizeOptions(max_rank=30, shapes="paper"),
    )


def test_mnli_dense_count():
    model = build_transformer(TransformerConfig.mnli(), tensorized=False)
    rep = parameter_report(model)
    assert rep.total == 66_957_315
    assert (rep.tt_cores, rep.gates, rep.tensorized_layers) == (0, 0, 0)
    assert not any(isinstance(m, TTLinear | TTMEmbedding) for m in model.modules())


def test_mnli_tensorized_counts_are_exact(mnli_tt):
    rep = parameter_report(mnli_tt)
    assert rep.total == 1_490_157
    assert (rep.tt_cores, rep.gates, rep.other) == (1_026_528, 4_362, 459_267)
    assert rep.tensorized_layers == 6 * 6 + 1 + 1
    enc = [
        m
        for n, m in mnli_tt.named_modules()
        if n.startswith("encoder.") and isinstance(m, TTLinear)
    ]
    assert len(enc) == 36
    enc_tt = sum(m.tt_parameters() for m in enc)
    enc_dense = sum(m.dense_parameters() for m in enc)
    assert (enc_tt, enc_dense) == (838_272, 42_467_328)
    assert round(enc_dense / enc_tt, 1) == 50.7
    word = mnli_tt.embeddings.word
    assert word.tt_parameters() == 167_808 and word.dense_parameters() == 23_440_896
    assert mnli_tt.classifier.fc1.tt_parameters() == 20_448


def test_mnli_shapes_and_ranks(mnli_tt):
    block = mnli_tt.encoder[0]
    for name in ("q", "k", "v", "out"):
        lin = getattr(block.attn, name)
        assert (lin.in_modes, lin.out_modes) == ((12, 8, 8), (8, 8, 12))
        assert lin.ranks == (1, 12, 30, 30, 30, 12, 1) and lin.tt_parameters() == 20_448
    fc1, fc2 = block.ffn.fc1, block.ffn.fc2
    assert (fc1.in_modes, fc1.out_modes) == ((12, 8, 8), (12, 16, 16))
    assert (fc2.in_modes, fc2.out_modes) == ((16, 16, 12), (8, 8, 12))
    assert fc1.ranks == (1, 12, 30, 30, 30, 16, 1) and fc1.tt_parameters() == 28_960
    assert fc2.ranks == (1, 16, 30, 30, 30, 12, 1) and fc2.tt_parameters() == 28_960
    cls1 = mnli_tt.classifier.fc1
    assert (cls1.in_modes, cls1.out_modes, cls1.ranks) == (
        (12, 8, 8),
        (8, 8, 12),
        (1, 12, 30, 30, 30, 12, 1),
    )
    word = mnli_tt.embeddings.word
    assert word.row_modes == (16, 20, 10, 10) and word.col_modes == (4, 4, 8, 6)
    assert word.ranks == (1, 32, 32, 32, 1)
    # dense parts stay dense
    assert type(mnli_tt.classifier.fc2) is nn.Linear
    assert type(mnli_tt.embeddings.position) is nn.Embedding
    assert type(mnli_tt.embeddings.token_type) is nn.Embedding
    assert block.norm1.eps == 1e-9


def test_embedding_ranks_do_not_follow_max_rank():
    model = build_transformer(
        TransformerConfig.mnli(n_layers=1),
        tensorized=True,
        options=TensorizeOptions(max_rank=8, shapes="paper"),
    )
    assert model.embeddings.word.ranks == (1, 32, 32, 32, 1)
    assert model.encoder[0].attn.q.ranks == (1, 8, 8, 8, 8, 8, 1)


def tiny(**changes) -> TransformerConfig:
    return TransformerConfig.tiny(**changes)


@pytest.mark.parametrize("tensorized", [False, True])
def test_tiny_forward_shape_and_backward(tensorized):
    cfg = tiny(num_classes=4)
    model = build_transformer(cfg, tensorized=tensorized, options=TensorizeOptions(max_rank=4))
    if tensorized:
        kinds = {type(m) for m in model.modules()}
        assert TTLinear in kinds and TTMEmbedding in kinds
        assert isinstance(model.encoder[1].ffn.fc2, TTLinear)
    ids = torch.randint(0, 100, (3, 11))
    types = (torch.arange(11) > 5).long().expand(3, 11)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 8:] = 0
    logits = model(ids, types, mask)
    assert logits.shape == (3, 4) and torch.isfinite(logits).all()
    F.cross_entropy(logits, torch.tensor([0, 1, 3])).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    if tensorized:
        assert model.embeddings.word.cores[0].grad.abs().sum() > 0


@pytest.mark.parametrize("tensorized", [False, True])
def test_padding_is_masked(tensorized):
    cfg = tiny()
    model = build_transformer(
        cfg, tensorized=tensorized, options=TensorizeOptions(max_rank=4)
    ).double()
    model.eval()
    ids = torch.randint(1, 100, (2, 7))
    types = torch.zeros_like(ids)
    types[:, 4:] = 1
    base = model(ids, types, torch.ones_like(ids))
    pad = torch.randint(0, 100, (2, 5))  # arbitrary ids in the padded slots
    ids2 = torch.cat([ids, pad], dim=1)  # (2, 12)
    types2 = torch.cat([types, torch.ones_like(pad)], dim=1)
    mask2 = torch.cat([torch.ones_like(ids), torch.zeros_like(pad)], dim=1)
    assert_close_rel(model(ids2, types2, mask2), base, 1e-10, "padded positions leak")
    unmasked = model(ids2, types2, torch.ones_like(ids2))
    assert (unmasked - base).abs().max() > 1e-6  # without the mask the padding does matter


def test_deterministic_with_seed():
    cfg = tiny()
    ids = torch.randint(0, 100, (2, 9))
    outs, states = [], []
    for _ in range(2):
        torch.manual_seed(123)
        model = build_transformer(cfg, tensorized=True, options=TensorizeOptions(max_rank=4)).eval()
        outs.append(model(ids))
        states.append(model.state_dict())
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    torch.manual_seed(124)
    other = build_transformer(cfg, tensorized=True, options=TensorizeOptions(max_rank=4)).eval()
    assert not torch.equal(other(ids), outs[0])


def test_token_types_and_length_checks():
    model = build_transformer(tiny(dropout=0.0, attn_dropout=0.0), tensorized=False).eval()
    ids = torch.randint(0, 100, (2, 6))
    a = model(ids)
    b = model(ids, torch.ones_like(ids))
    assert (a - b).abs().max() > 0
    assert torch.equal(a, model(ids, torch.zeros_like(ids)))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(6, dtype=torch.long))


def test_dense_model_compresses_to_the_same_function():
    model = build_transformer(tiny(), tensorized=False).double().eval()
    ids = torch.randint(0, 100, (2, 8))
    ref = model(ids)
    summary = compress_(model, CompressConfig(max_rank=10_000))
    names = {r.name for r in summary.layers}
    assert {f"encoder.1.{n}" for n in ENCODER_LINEARS} <= names
    assert "embeddings.word" in names and "classifier.fc2" in names
    assert_close_rel(model(ids), ref, 1e-8, "compress_ full rank on the transformer")


def test_shape_preset_checks():
    with pytest.raises(ValueError, match="shapes='mnli'"):
        build_transformer(tiny(), tensorized=True)
    with pytest.raises(ValueError, match="shapes"):
        build_transformer(tiny(), tensorized=True, shapes="bert")


def test_the_keyword_form_builds_what_its_options_build():
    """``max_rank=4, shapes="auto"`` (earlier releases) is read into the same options: the
    same layers and, from the same seed, the same weights."""
    for cfg, keywords, options in (
        (tiny(), {"max_rank": 4, "shapes": "auto", "d": 2}, TensorizeOptions(max_rank=4, d=2)),
        (
            TransformerConfig.mnli(n_layers=1),
            {"max_rank": 8},
            TensorizeOptions(max_rank=8, shapes="paper"),
        ),
    ):
        torch.manual_seed(0)
        old = build_transformer(cfg, tensorized=True, **keywords)
        torch.manual_seed(0)
        new = build_transformer(cfg, tensorized=True, options=options)
        assert old.tensorize_report == new.tensorize_report
        old_state, new_state = old.state_dict(), new.state_dict()
        assert old_state.keys() == new_state.keys()
        assert all(torch.equal(old_state[k], new_state[k]) for k in old_state)
    with pytest.raises(TypeError, match="not both"):
        build_transformer(tiny(), tensorized=True, options=TensorizeOptions(), max_rank=4)
    with pytest.raises(TypeError, match="rank"):
        build_transformer(tiny(), tensorized=False, rank=4)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vocab_size", 0),
        ("d_model", 30),
        ("n_layers", 0),
        ("dropout", 1.0),
        ("attn_dropout", -0.1),
        ("ln_eps", 0.0),
        ("num_classes", True),
        ("version", 2),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TransformerConfig(**{field: value})


def test_config_round_trip():
    cfg = tiny(num_classes=5)
    assert TransformerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.replace(n_layers=3).n_layers == 3
    with pytest.raises(ValueError, match="unknown field"):
        TransformerConfig.from_dict({**cfg.to_dict(), "layers": 2})
    with pytest.raises(ValueError, match="version"):
        TransformerConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "version"})


# -- builder options: layers, min_size, gate_threshold, embedding_max_rank, d ----------------
def tt_names(model) -> set[str]:
    return {n for n, m in model.named_modules() if isinstance(m, TTLinear | TTMEmbedding)}


def test_layer_patterns_select_exactly():
    model = build_transformer(
        tiny(),
        tensorized=True,
        options=TensorizeOptions(max_rank=4, layers=["encoder.0.*"]),
    )
    assert tt_names(model) == {f"encoder.0.{n}" for n in ENCODER_LINEARS}
    assert type(model.embeddings.word) is nn.Embedding
    assert type(model.classifier.fc1) is nn.Linear and type(model.encoder[1].ffn.fc1) is nn.Linear
    skipped = {s.name for s in model.tensorize_report.skipped}
    assert skipped == {f"encoder.1.{n}" for n in ENCODER_LINEARS} | {
        "embeddings.word",
        "classifier.fc1",
    }
    only = build_transformer(
        tiny(),
        tensorized=True,
        options=TensorizeOptions(max_rank=4, layers=["*.ffn.fc2", "embeddings.word"]),
    )
    assert tt_names(only) == {"encoder.0.ffn.fc2", "encoder.1.ffn.fc2", "embeddings.word"}
    with pytest.raises(ValueError, match="layers"):
        build_transformer(
            tiny(),
            tensorized=True,
            options=TensorizeOptions(layers=["classifier.fc2"]),
        )


def test_min_size_keeps_small_linears_dense():
    cfg = tiny(d_model=16, d_ff=32)  # attn 256, ffn 512, cls1 256 entries; word 100x16 = 1600
    model = build_transformer(cfg, tensorized=True, options=TensorizeOptions(max_rank=4))
    assert tt_names(model) == {"embeddings.word"}
    reasons = {s.name: s.reason for s in model.tensorize_report.skipped}
    assert "min_size=1024" in reasons["encoder.0.ffn.fc1"]
    assert (
        len(
            tt_names(
                build_transformer(
                    cfg,
                    tensorized=True,
                    options=TensorizeOptions(max_rank=4, min_size=256),
                )
            )
        )
        == 1 + 2 * 6 + 1
    )


def test_auto_shapes_take_every_option():
    model = build_transformer(
        tiny(),
        tensorized=True,
        options=TensorizeOptions(max_rank=3, embedding_max_rank=6, gate_threshold=0.25, d=2),
    )
    q, word = model.encoder[0].attn.q, model.embeddings.word
    assert len(q.in_modes) == 2 and max(q.ranks) == 3 and q.gate_threshold == 0.25
    assert len(word.row_modes) == 2 and max(word.ranks) == 6 and word.gate_threshold == 0.25


def test_mnli_shapes_take_gate_threshold_and_embedding_rank():
    cfg = TransformerConfig.mnli(n_layers=1)
    model = build_transformer(
        cfg,
        tensorized=True,
        options=TensorizeOptions(
            max_rank=8, gate_threshold=0.05, embedding_max_rank=16, shapes="paper"
        ),
    )
    word = model.embeddings.word
    assert word.row_modes == (16, 20, 10, 10) and word.ranks == (1, 16, 16, 16, 1)
    q = model.encoder[0].attn.q
    assert (q.in_modes, q.out_modes) == ((12, 8, 8), (8, 8, 12))
    assert q.gate_threshold == word.gate_threshold == 0.05
    with pytest.raises(ValueError, match="d must be None"):
        build_transformer(cfg, tensorized=True, options=TensorizeOptions(d=3, shapes="paper"))
    partial = build_transformer(
        cfg, tensorized=True, options=TensorizeOptions(layers=["embeddings.*"], shapes="paper")
    )
    assert tt_names(partial) == {"embeddings.word"} and partial.embeddings.word.ranks[1] == 32
