"""Masked LM: loss over labelled positions only, the selected-rows head, layer names, config."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.models.encoder import EncoderBlock
from engine.models.encoder_config import TransformerConfig
from engine.models.mlm import MaskedLM, MLMConfig, build_mlm
from engine.models.registry import get_workload
from engine.models.tensorize import TensorizeOptions
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from tests.helpers.assertions import assert_close_rel

CFG = MLMConfig.tiny(dropout=0.0, attn_dropout=0.0)


def batch(b: int = 3, s: int = 10, seed: int = 0) -> dict[str, torch.Tensor]:
    return get_workload("mlm").example_batch(CFG, b, torch.Generator().manual_seed(seed), seq_len=s)


@pytest.mark.parametrize("tensorized", [False, True])
def test_loss_ignores_unlabelled_positions(tensorized):
    model = (
        build_mlm(CFG, tensorized=tensorized, options=TensorizeOptions(max_rank=4)).double().eval()
    )
    data = batch()
    labels = data["labels"]
    assert (labels == -100).any() and (labels != -100).any()
    step = get_workload("mlm").forward_loss(model, data)
    logits = model(data["input_ids"], data["attention_mask"])  # (B, S, V) all positions
    terms, hits = [], 0
    for b in range(labels.shape[0]):
        for s in range(labels.shape[1]):
            if labels[b, s] != -100:
                terms.append(-torch.log_softmax(logits[b, s], -1)[labels[b, s]])
                hits += int(logits[b, s].argmax() == labels[b, s])
    manual = torch.stack(terms).mean()
    assert abs(float(step.loss.detach()) - float(manual.detach())) < 1e-12
    assert float(step.sums["count"]) == len(terms) == int((labels != -100).sum())
    assert abs(float(step.sums["loss_sum"]) - float(manual.detach()) * len(terms)) < 1e-10
    assert float(step.sums["correct"]) == hits
    # a position counts exactly when its label is set
    moved = dict(data, labels=labels.clone())
    pos = (labels == -100).nonzero()[0]
    moved["labels"][pos[0], pos[1]] = 3
    assert float(get_workload("mlm").forward_loss(model, moved).sums["count"]) == len(terms) + 1


def test_selected_rows_equal_the_full_logits():
    model = build_mlm(CFG, tensorized=True, options=TensorizeOptions(max_rank=4)).double().eval()
    data = batch()
    select = data["labels"] != -100
    full = model(data["input_ids"], data["attention_mask"])  # (B, S, V)
    part = model(data["input_ids"], data["attention_mask"], select=select)  # (N, V)
    assert part.shape == (int(select.sum()), CFG.vocab_size)
    assert_close_rel(part, full[select], 1e-12, "select rows")


def test_no_labelled_position_gives_zero_loss_with_a_graph():
    model = build_mlm(CFG, tensorized=True, options=TensorizeOptions(max_rank=4))
    data = batch()
    data["labels"] = torch.full_like(data["labels"], -100)
    step = get_workload("mlm").forward_loss(model, data)
    assert float(step.loss.detach()) == 0.0 and float(step.sums["count"]) == 0
    step.loss.backward()  # no NaN, no error


def test_padding_is_masked():
    model = build_mlm(CFG, tensorized=False).double().eval()
    ids = torch.randint(0, CFG.vocab_size, (2, 6))
    base = model(ids, torch.ones_like(ids))
    ids2 = torch.cat([ids, torch.randint(0, CFG.vocab_size, (2, 3))], 1)
    mask2 = torch.cat([torch.ones_like(ids), torch.zeros(2, 3, dtype=torch.long)], 1)
    assert_close_rel(model(ids2, mask2)[:, :6], base, 1e-10, "padding leaks")


def test_reuses_the_transformer_encoder_and_names_its_layers():
    model = build_mlm(CFG, tensorized=True, options=TensorizeOptions(max_rank=4))
    assert all(isinstance(b, EncoderBlock) for b in model.encoder) and len(model.encoder) == 2
    tt = {n for n, m in model.named_modules() if isinstance(m, TTLinear | TTMEmbedding)}
    enc = {
        f"encoder.{i}.{p}"
        for i in range(2)
        for p in ("attn.q", "attn.k", "attn.v", "attn.out", "ffn.fc1", "ffn.fc2")
    }
    assert tt == enc | {"embeddings.word", "head.transform", "head.decoder"}
    assert isinstance(model.embeddings.word, TTMEmbedding)
    assert type(model.embeddings.position) is nn.Embedding
    assert model.head.decoder.out_features == CFG.vocab_size
    head_only = build_mlm(
        CFG, tensorized=True, options=TensorizeOptions(max_rank=4, layers=["head.*"])
    )
    tt = {n for n, m in head_only.named_modules() if isinstance(m, TTLinear | TTMEmbedding)}
    assert tt == {"head.transform", "head.decoder"}
    assert type(head_only.embeddings.word) is nn.Embedding


def test_head_is_transform_gelu_norm_decoder():
    model = MaskedLM(CFG).double()
    h = torch.randn(4, CFG.d_model, dtype=torch.float64)
    head = model.head
    t = F.gelu(h @ head.transform.weight.T + head.transform.bias)
    ref = F.layer_norm(t, (CFG.d_model,), head.norm.weight, head.norm.bias, CFG.ln_eps)
    ref = ref @ head.decoder.weight.T + head.decoder.bias
    assert_close_rel(head(h), ref, 1e-12, "MLM head")


def test_input_checks():
    model = MaskedLM(CFG)
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, CFG.max_len + 1, dtype=torch.long))


def test_config():
    base = MLMConfig()
    assert (base.n_layers, base.d_model, base.vocab_size, base.ln_eps) == (12, 768, 30522, 1e-12)
    enc = CFG.encoder_config()
    assert isinstance(enc, TransformerConfig) and enc.d_model == 32 and enc.ln_eps == 1e-12
    assert MLMConfig.from_dict(json.loads(json.dumps(CFG.to_dict()))) == CFG
    for field, value in [("vocab_size", 0), ("d_model", 30), ("dropout", 1), ("version", 3)]:
        with pytest.raises(ValueError, match=field):
            MLMConfig.tiny(**{field: value})
    with pytest.raises(ValueError, match="unknown field"):
        MLMConfig.from_dict({**CFG.to_dict(), "num_classes": 2})
