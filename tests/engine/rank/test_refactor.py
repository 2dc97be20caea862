"""Refactoring TT linears into more cores (:mod:`engine.rank.refactor`): the rewritten layer
computes what the old one did (against a float64 reference of its weight), keeps the matrix
rank on the bond between the sides, and an optimizer follows: exactly the model's parameters
in the right groups, the old cores' state gone, the bias's kept."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.rank.refactor import refactor_layer, refactor_model_
from engine.train.optim import group_parameters


def _layer(n_in: int, n_out: int, rank: int, seed: int = 0) -> TTLinear:
    """A two-core layer with gates spread around the threshold (some entries dead)."""
    torch.manual_seed(seed)
    layer = TTLinear(n_in, n_out, True, max_rank=rank, d=1)
    with torch.no_grad():
        layer.gates[0].uniform_(0.0, 2.0)
        layer.gates[0][:2] = 0.0  # below the threshold: these ranks are off
    return layer


def _reference(layer: TTLinear) -> torch.Tensor:
    """The layer's effective weight (out, in) in float64."""
    with torch.no_grad():
        return layer.to_dense(torch.float64)


@pytest.mark.parametrize(("n_in", "n_out", "rank"), [(64, 256, 16), (384, 256, 12), (30, 100, 9)])
@pytest.mark.parametrize("d", [2, 3])
def test_the_rewritten_layer_computes_the_same_output(n_in, n_out, rank, d):
    old = _layer(n_in, n_out, rank)
    new = refactor_layer(old, d)
    assert len(new.in_modes) == len(new.out_modes) == d
    assert math.prod(new.in_modes) >= n_in and math.prod(new.out_modes) >= n_out
    want = _reference(old)
    got = _reference(new)
    assert torch.linalg.norm(got - want) <= 1e-6 * torch.linalg.norm(want)
    x = torch.randn(7, n_in)
    with torch.no_grad():
        assert torch.allclose(new(x), old(x), rtol=1e-4, atol=1e-5)
    assert new.bias is old.bias
    assert all(torch.equal(g, torch.ones_like(g)) for g in new.gates)


def test_the_bond_between_the_sides_keeps_the_matrix_rank_and_the_outer_bonds_are_full():
    old = _layer(64, 256, 16)
    live = int((old.gates[0] > old.gate_threshold).sum())  # 14: two entries are off
    new = refactor_layer(old, 2)
    (n1, _), (_, m2) = new.in_modes, new.out_modes
    assert new.ranks == (1, n1, live, m2, 1)
    assert int(torch.linalg.matrix_rank(_reference(old))) == live
    # a few more entries than U and V: the two small outer cores
    assert new.tt_parameters() == old.tt_parameters() * live // 16 + n1 * n1 + m2 * m2


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = _layer(64, 128, 8, seed=1)
        self.b = TTLinear(128, 64, True, max_rank=4, d=2)  # already two modes a side
        self.c = _layer(3, 64, 3, seed=2)  # too narrow for two modes of >= 2 a side
        self.head = nn.Linear(64, 4)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = model.head(model.c(model.b(model.a(torch.randn(5, 64)))[:, :3])).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_the_optimizer_follows_the_model():
    torch.manual_seed(0)
    model = _Net()
    groups = group_parameters(model)
    optimizer = torch.optim.AdamW(
        [{"params": [p for _, p in ps], "name": g} for g, ps in groups.items() if ps], lr=1e-3
    )
    _step(model, optimizer)
    old_a, kept_b, bias_state = model.a, model.b, optimizer.state[model.a.bias]["exp_avg"].clone()
    done = refactor_model_(model, 2, optimizer)
    assert set(done) == {"a"}  # b has two modes a side already, c is too narrow
    assert done["a"]["ranks_before"] == [1, 8, 1] and done["a"]["in_modes"] == [8, 8]
    assert model.b is kept_b and isinstance(model.c, TTLinear) and len(model.c.in_modes) == 1
    by_name = {g["name"]: {id(p) for p in g["params"]} for g in optimizer.param_groups}
    assert by_name == {g: {id(p) for _, p in ps} for g, ps in group_parameters(model).items() if ps}
    stale = {id(p) for p in (*old_a.cores, *old_a.gates)}
    assert not stale & {id(p) for p in optimizer.state}
    assert torch.equal(optimizer.state[model.a.bias]["exp_avg"], bias_state)
    _step(model, optimizer)  # the new cores train
    assert all(p in optimizer.state for p in model.a.cores)


def test_nothing_to_rewrite_leaves_the_optimizer_alone():
    model = _Net()
    optimizer = torch.optim.SGD(
        [{"params": list(model.parameters()), "name": "others"}], lr=0.1
    )  # no cores group: it is never needed when nothing changes
    model.a = TTLinear(64, 128, True, max_rank=4, d=2)
    assert refactor_model_(model, 2, optimizer) == {}
    with pytest.raises(ValueError, match="no 'cores' param group"):
        refactor_model_(_Net(), 2, optimizer)
