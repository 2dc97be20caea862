"""densify: plain nn.Linear / nn.Embedding twins equal to the tensorized model."""

from __future__ import annotations

import copy

import torch
from torch import nn

from engine.export import densify, export_compressed, load_compressed
from engine.models.registry import TensorizeOptions, get_workload
from engine.models.transformer import TransformerConfig
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from tests.engine.export.conftest import kill_and_shrink_, make_batch
from tests.helpers.assertions import assert_close_rel


def _args(batch):
    return batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]


def _tt_float64_model():
    cfg = TransformerConfig.tiny()
    wl = get_workload("transformer")
    model = wl.build(cfg, tensorized=True, options=TensorizeOptions(max_rank=5)).double()
    kill_and_shrink_(model)
    return cfg, model.eval()


def test_densified_transformer_equals_tt_in_float64():
    cfg, model = _tt_float64_model()
    before = copy.deepcopy(model.state_dict())
    dense = densify(model)
    batch = make_batch(cfg.vocab_size)
    with torch.no_grad():
        want, got = model(*_args(batch)), dense(*_args(batch))  # (B, C)
    assert_close_rel(got, want, 1e-10, "densified vs TT logits")
    assert not any(isinstance(m, TTLinear | TTMEmbedding) for m in dense.modules())
    assert not [k for k in dense.state_dict() if ".cores." in k or ".gates." in k]
    assert {p.dtype for p in dense.parameters()} == {torch.float64}
    assert not dense.training
    # the input is untouched and still tensorized
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert isinstance(model.encoder[0].attn.q, TTLinear)


def test_densified_state_dict_loads_into_the_dense_build():
    cfg, model = _tt_float64_model()
    dense = densify(model)
    plain = get_workload("transformer").build(cfg, tensorized=False, options=TensorizeOptions())
    plain = plain.double().eval()
    plain.load_state_dict(dense.state_dict(), strict=True)  # same names, only plain layers
    types = {type(m) for m in plain.modules()} - {type(plain)}
    assert types.isdisjoint({TTLinear, TTMEmbedding})
    batch = make_batch(cfg.vocab_size)
    with torch.no_grad():
        assert_close_rel(plain(*_args(batch)), model(*_args(batch)), 1e-10, "dense build")


def test_densify_a_loaded_checkpoint(trained, tmp_path):
    export_compressed(trained.model, tmp_path, **trained.export_kwargs())
    loaded, _ = load_compressed(tmp_path)
    dense = densify(loaded)
    assert_close_rel(trained.logits(dense), trained.logits(trained.model), 1e-5, "densified")


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = TTMEmbedding(50, 8, max_rank=4, padding_idx=3, dtype=torch.float64)
        shared = TTLinear(8, 6, max_rank=3, dtype=torch.float64)
        self.a, self.b = shared, shared
        self.head = TTLinear(6, 5, bias=False, max_rank=2, dtype=torch.float64)

    def forward(self, ids):
        x = self.emb(ids)  # (B, S, 8)
        return self.head(self.a(x) + self.b(x))  # (B, S, 5)


def test_padding_idx_sharing_and_bias_free_layers():
    torch.manual_seed(3)
    toy = _Toy().train()
    with torch.no_grad():
        toy.emb.gates[0][0] = 0.0
    ids = torch.tensor([[3, 0, 49, 3], [7, 8, 9, 10]])
    dense = densify(toy)
    assert isinstance(dense.emb, nn.Embedding) and dense.emb.padding_idx == 3
    assert torch.equal(dense.emb.weight[3], torch.zeros(8, dtype=torch.float64))
    assert dense.a is dense.b and isinstance(dense.a, nn.Linear)
    assert dense.head.bias is None and dense.training
    assert_close_rel(dense(ids), toy(ids), 1e-10, "toy")
    # the padding row gets no gradient, as in the TTM lookup
    dense(ids).sum().backward()
    assert torch.equal(dense.emb.weight.grad[3], torch.zeros(8, dtype=torch.float64))
    # a bare TT layer densifies to its twin
    lin = densify(toy.head)
    x = torch.randn(4, 6, dtype=torch.float64)
    assert_close_rel(lin(x), toy.head(x), 1e-10, "bare layer")
