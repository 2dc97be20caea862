"""The automatic start's weights (:mod:`engine.train.auto_start`): each TT layer the
decomposition of its dense twin at the layer's ranks (against float64 references: the
truncated SVD, the TT-SVD rebuilt), the rest copied, and twins that do not correspond
refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.train.auto_start import warm_start_
from engine.tt.decompose import matrix_to_tt, tt_to_full


class Net(nn.Module):
    """An embedding, two linears and a LayerNorm: dense, or with TT / TTM layers."""

    def __init__(self, tt: bool, rank: int = 6, d: int = 1) -> None:
        super().__init__()
        if tt:
            self.emb = TTMEmbedding(24, 16, max_rank=rank, row_modes=(4, 6), col_modes=(4, 4))
            self.a = TTLinear(16, 12, max_rank=rank, d=d)
            self.b = TTLinear(12, 10, max_rank=rank, d=d)
        else:
            self.emb, self.a, self.b = nn.Embedding(24, 16), nn.Linear(16, 12), nn.Linear(12, 10)
        self.norm, self.out = nn.LayerNorm(10), nn.Linear(10, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(self.emb(ids)))
        return self.out(self.norm(self.b(h)))


def _twin(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    dense = Net(tt=False)
    with torch.no_grad():  # not a fresh init: every value differs from the TT model's draw
        for p in dense.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return dense


def test_two_core_layers_are_the_truncated_svd_and_the_rest_is_copied():
    dense = _twin()
    torch.manual_seed(1)
    model = Net(tt=True, rank=6, d=1)
    record = warm_start_(model, dense)
    for name in ("a", "b"):
        layer, w = getattr(model, name), getattr(dense, name).weight.detach().double()
        assert len(layer.cores) == 2 and layer.ranks == (1, 6, 1)
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        best = (u[:, :6] * s[:6]) @ vh[:6]  # Eckart-Young: the best rank-6 (out, in)
        assert torch.allclose(layer.to_dense().double(), best, atol=1e-5)
        error = float(s[6:].norm() / s.norm())
        assert record["error"][name] == pytest.approx(error, rel=1e-4)
        assert all(torch.equal(g, torch.ones_like(g)) for g in layer.gates)
        assert torch.equal(layer.bias, getattr(dense, name).bias)
    for name in ("norm.weight", "norm.bias", "out.weight", "out.bias"):
        assert torch.equal(model.get_parameter(name), dense.get_parameter(name))
    assert set(record["error"]) == {"emb", "a", "b"}


def test_four_core_layers_and_embeddings_are_the_tt_svd_rebuilt_in_float64():
    dense = _twin(2)
    model = Net(tt=True, rank=3, d=2)
    record = warm_start_(model, dense)
    layer, w = model.a, dense.a.weight.detach()
    cores = matrix_to_tt(w.double(), layer.in_modes, layer.out_modes, max_rank=3)
    ref = tt_to_full(cores).reshape(16, 12).T  # (out, in)
    assert torch.allclose(layer.to_dense().double(), ref, atol=1e-5)
    table = dense.emb.weight.detach().double()
    emb = model.emb.to_dense().detach().double()  # (V, D)
    assert emb.shape == table.shape
    err = float((emb - table).norm().detach() / table.norm())
    assert record["error"]["emb"] == pytest.approx(err, rel=1e-4) and 0 < err < 1
    with torch.no_grad():  # the same rows as the dense lookup of the rebuilt table
        ids = torch.tensor([[0, 5, 23]])
        assert torch.allclose(model.emb(ids).double(), emb[ids], atol=1e-5)


def test_a_twin_that_does_not_correspond_is_refused_and_the_model_left_as_it_was():
    model = Net(tt=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    other = _twin()
    other.out = nn.Linear(10, 4)  # another head: found after every TT layer was set
    with pytest.raises(ValueError, match="out.weight"):
        warm_start_(model, other)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    other = _twin()
    other.a = TTLinear(16, 12, max_rank=2)  # no dense layer to decompose
    with pytest.raises(ValueError, match="a: no dense twin of a TTLinear"):
        warm_start_(model, other)
