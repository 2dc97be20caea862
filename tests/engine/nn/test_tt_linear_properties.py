"""Property test: any order, any modes, any ranks, any plan equals the dense oracle."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.contract.plan import candidate_plans
from engine.nn.tt_linear import TTLinear
from tests.helpers.assertions import assert_close_rel, grads

PLANS = [str(p) for p in candidate_plans()]


@st.composite
def layers(draw):
    d = draw(st.integers(2, 4))
    in_modes = tuple(draw(st.lists(st.integers(1, 4), min_size=d, max_size=d)))
    out_modes = tuple(draw(st.lists(st.integers(1, 4), min_size=d, max_size=d)))
    n_pad, m_pad = math.prod(in_modes), math.prod(out_modes)
    in_features = draw(st.integers(max(1, n_pad - 3), n_pad))  # some padding
    out_features = draw(st.integers(max(1, m_pad - 3), m_pad))
    ranks = tuple(draw(st.lists(st.integers(1, 4), min_size=2 * d - 1, max_size=2 * d - 1)))
    gates = [
        draw(st.lists(st.sampled_from([-0.5, 0.004, 0.3, 1.0, 1.7]), min_size=r, max_size=r))
        for r in ranks
    ]
    return {
        "in_features": in_features,
        "out_features": out_features,
        "in_modes": in_modes,
        "out_modes": out_modes,
        "ranks": ranks,
        "gates": gates,
        "bias": draw(st.booleans()),
        "rows": draw(st.integers(1, 9)),
        "plan": draw(st.sampled_from(PLANS)),
    }


@settings(max_examples=150, deadline=None, derandomize=True)
@given(spec=layers())
def test_every_plan_matches_the_dense_reconstruction(spec):
    layer = TTLinear(
        spec["in_features"],
        spec["out_features"],
        spec["bias"],
        in_modes=spec["in_modes"],
        out_modes=spec["out_modes"],
        ranks=spec["ranks"],
        plan=spec["plan"],
        dtype=torch.float64,
    )
    with torch.no_grad():
        for g, values in zip(layer.gates, spec["gates"], strict=True):
            g.copy_(torch.tensor(values, dtype=torch.float64))
    x = torch.randn(spec["rows"], spec["in_features"], dtype=torch.float64, requires_grad=True)
    dy = torch.randn(spec["rows"], spec["out_features"], dtype=torch.float64)
    params = [x, *layer.parameters()]
    y = layer(x)
    got = grads(y, params, dy)
    layer.plan = "reference"
    y_ref = layer(x)
    want = grads(y_ref, params, dy)
    assert_close_rel(y, y_ref, 1e-10, "output")
    for g, w in zip(got, want, strict=True):
        assert_close_rel(g, w, 1e-10, "gradient")

    # shrinking (rank 0 included, when a whole bond is dead) changes nothing
    layer.plan = spec["plan"]
    layer.shrink_()
    assert layer.ranks == layer.active_ranks() or 0 in layer.ranks
    assert_close_rel(layer(x), y_ref, 1e-10, "output after shrink")
