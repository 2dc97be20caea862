"""Shrinking mid-training: optimizer state follows, and the trajectory is unchanged."""

from __future__ import annotations

import copy

import torch

from engine.nn.tt_linear import TTLinear
from engine.tt.surgery import slice_optimizer_state_
from tests.helpers.assertions import assert_close_rel


def _train(layer, opt, x, y, steps):
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(layer(x), y).backward()
        opt.step()


def test_shrink_with_sliced_adam_state_keeps_the_training_trajectory():
    layer = TTLinear(
        24, 18, in_modes=(4, 6), out_modes=(3, 6), ranks=(4, 6, 3), dtype=torch.float64
    )
    with torch.no_grad():  # dead from the start: zero gradient, zero Adam moments
        layer.gates[0][1] = -1.0
        layer.gates[1][2:4] = -1.0
    x = torch.randn(16, 24, dtype=torch.float64)
    y = torch.randn(16, 18, dtype=torch.float64)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    _train(layer, opt, x, y, 3)

    twin = copy.deepcopy(layer)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-2)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict aliases
    record = twin.shrink_()
    assert twin.ranks == (1, 3, 4, 3, 1)
    expected = {p: {k: v.clone() for k, v in twin_opt.state[p].items()} for p in record}
    slice_optimizer_state_(twin_opt, record)
    for p, cuts in record.items():
        for key in ("exp_avg", "exp_avg_sq"):
            want = expected[p][key]
            for dim, idx in cuts:
                want = want.index_select(dim, idx)
            assert torch.equal(twin_opt.state[p][key], want)
            assert twin_opt.state[p][key].shape == p.shape

    _train(layer, opt, x, y, 4)
    _train(twin, twin_opt, x, y, 4)
    assert_close_rel(twin(x), layer(x), 1e-10, "shrunk twin vs original after training")
    keep0 = torch.tensor([0, 2, 3])
    assert_close_rel(twin.cores[0], layer.cores[0].index_select(2, keep0), 1e-12, "core 0")
