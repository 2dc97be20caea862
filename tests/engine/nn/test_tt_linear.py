"""TTLinear against the float64 dense reconstruction (forward and every gradient)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from engine.contract.plan import candidate_plans
from engine.nn.tt_linear import TTLinear
from tests.helpers.assertions import assert_close_rel, grads

# (in, out, in_modes, out_modes, internal ranks): d = 2, 3, 4 per side, odd sizes and padding
CASES = [
    (35, 22, (5, 7), (2, 11), (3, 4, 2)),
    (30, 17, (4, 8), (3, 6), (4, 5, 3)),  # both sides padded
    (57, 40, (5, 3, 4), (2, 7, 3), (3, 4, 5, 4, 3)),  # 60 >= 57, 42 >= 40
    (60, 33, (3, 2, 5, 2), (2, 3, 3, 2), (3, 5, 4, 6, 5, 4, 2)),
]
PLANS = ["auto", *[str(p) for p in candidate_plans()]]


def make_layer(case, bias=True, plan="auto", dead=True) -> TTLinear:
    n, m, in_modes, out_modes, ranks = case
    layer = TTLinear(
        n,
        m,
        bias,
        in_modes=in_modes,
        out_modes=out_modes,
        ranks=ranks,
        plan=plan,
        dtype=torch.float64,
    )
    with torch.no_grad():
        for g in layer.gates:
            g.uniform_(0.2, 1.5)
            if dead:
                g[0] = 0.005  # below tau = 1e-2
                if g.numel() > 2:
                    g[-1] = -0.3  # negative: masked too
    return layer


def reference_outputs(layer: TTLinear, x: torch.Tensor, dy: torch.Tensor):
    params = [x, *layer.parameters()]
    layer.plan = "reference"
    y = layer(x)
    return y, grads(y, params, dy)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}d{len(c[2])}")
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_all_gradients_match_dense_reconstruction(case, plan, bias):
    layer = make_layer(case, bias=bias, plan=plan)
    x = torch.randn(2, 3, case[0], dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 3, case[1], dtype=torch.float64)
    params = [x, *layer.parameters()]
    y = layer(x)
    got = grads(y, params, dy)
    y_ref, want = reference_outputs(layer, x, dy)
    assert_close_rel(y, y_ref, 1e-10, "output")
    names = ["x", *(n for n, _ in layer.named_parameters())]
    for name, g, w in zip(names, got, want, strict=True):
        assert_close_rel(g, w, 1e-10, f"grad {name}")
    # masked gate entries get exactly zero gradient
    by_name = dict(zip(names, got, strict=True))
    for k, gate in enumerate(layer.gates):
        g = by_name[f"gates.{k}"]
        assert torch.all(g[gate.detach() <= layer.gate_threshold] == 0)


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_auto_plan_matches_reference_across_row_counts(rows):
    layer = make_layer(CASES[2])
    x = torch.randn(rows, 57, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(rows, 40, dtype=torch.float64)
    y = layer(x)
    got = grads(y, [x, *layer.parameters()], dy)
    y_ref, want = reference_outputs(layer, x, dy)
    assert_close_rel(y, y_ref, 1e-10, "output")
    for g, w in zip(got, want, strict=True):
        assert_close_rel(g, w, 1e-10, "grad")


def test_input_without_grad_and_float32():
    layer = make_layer(CASES[2]).float()
    x = torch.randn(4, 57)
    w = layer.to_dense()
    assert_close_rel(layer(x), x @ w.T + layer.bias, 1e-5, "float32 output")


def test_wrong_input_width_is_a_clear_error():
    layer = make_layer(CASES[0])
    with pytest.raises(ValueError, match="in_features=35"):
        layer(torch.randn(4, 34, dtype=torch.float64))


def test_to_dense_is_the_weight_and_rank_is_bounded_by_middle_rank():
    layer = make_layer(CASES[3], dead=False)
    x = torch.randn(6, 60, dtype=torch.float64)
    w = layer.to_dense()
    assert w.shape == (33, 60)
    assert_close_rel(layer(x), nn.functional.linear(x, w, layer.bias), 1e-12, "to_dense")
    assert torch.linalg.matrix_rank(w) <= layer.ranks[len(layer.in_modes)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}d{len(c[2])}")
def test_shrink_keeps_output_and_drops_exact_parameter_count(case):
    layer = make_layer(case)
    x = torch.randn(7, case[0], dtype=torch.float64)
    y0 = layer(x).detach()
    before = layer.num_parameters()
    live = layer.active_ranks()
    sizes = layer.mode_sizes
    expected = sum(live[k] * s * live[k + 1] for k, s in enumerate(sizes)) + sum(live[1:-1])
    expected += case[1]  # bias
    record = layer.shrink_()
    assert layer.ranks == live
    assert layer.num_parameters() == expected < before
    assert_close_rel(layer(x), y0, 1e-10, "output after shrink")
    assert all(p in record for p in layer.gates if p.numel() < case[4][0] + 100)
    # surviving gate values are kept as they were (not reset)
    assert all(torch.all(g > layer.gate_threshold) for g in layer.gates)


def test_shrink_with_a_dead_bond_leaves_only_the_bias():
    layer = make_layer(CASES[2])
    with torch.no_grad():
        layer.gates[2].fill_(-1.0)
    x = torch.randn(3, 57, dtype=torch.float64, requires_grad=True)
    y0 = layer(x).detach()
    assert_close_rel(y0, layer.bias.detach().expand(3, -1), 1e-12, "dead bond output")
    layer.shrink_()
    assert layer.tt_parameters() == 0 and layer.ranks == (1, 0, 0, 0, 0, 0, 1)
    y = layer(x)
    assert_close_rel(y, y0, 1e-12, "after shrink")
    y.sum().backward()
    assert torch.all(layer.bias.grad == 3)


def test_fold_gates_keeps_output():
    layer = make_layer(CASES[1])
    x = torch.randn(5, 30, dtype=torch.float64)
    y0 = layer(x).detach()
    layer.fold_gates_()
    assert all(torch.all(g == 1) for g in layer.gates)
    assert_close_rel(layer(x), y0, 1e-12, "after fold")


def test_from_linear_recovers_a_weight_of_known_tt_rank():
    src = make_layer(CASES[0], dead=False)  # modes multiply exactly: no padding
    lin = nn.Linear(35, 22, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(src.to_dense())
    tt = TTLinear.from_linear(lin, tol=1e-10, in_modes=(5, 7), out_modes=(2, 11))
    assert_close_rel(tt.to_dense(), lin.weight, 1e-8, "from_linear")
    assert tt.ranks == src.ranks
    x = torch.randn(3, 35, dtype=torch.float64)
    assert_close_rel(tt(x), lin(x), 1e-8, "from_linear output")


def test_from_linear_with_padding_reconstructs_the_unpadded_weight():
    src = make_layer(CASES[2], dead=False)
    lin = nn.Linear(57, 40, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(src.to_dense())
    tt = TTLinear.from_linear(lin, max_rank=64, in_modes=(5, 3, 4), out_modes=(2, 7, 3))
    assert_close_rel(tt.to_dense(), lin.weight, 1e-8, "from_linear padded")
    # laid out as a checkpoint loads them: a strided core can take another BLAS path and
    # round differently, and a resumed run would then not be the run it resumes
    assert all(c.is_contiguous() for c in tt.cores)


def test_from_linear_with_tolerance():
    lin = nn.Linear(64, 48, dtype=torch.float64)
    tt = TTLinear.from_linear(lin, tol=0.5)
    err = torch.linalg.norm(tt.to_dense() - lin.weight) / torch.linalg.norm(lin.weight)
    assert err <= 0.5


def test_mnli_preset_parameter_counts():
    r = 30
    attn = TTLinear(768, 768, in_modes=(12, 8, 8), out_modes=(8, 8, 12), max_rank=r)
    ffn1 = TTLinear(768, 3072, in_modes=(12, 8, 8), out_modes=(12, 16, 16), max_rank=r)
    ffn2 = TTLinear(3072, 768, in_modes=(16, 16, 12), out_modes=(8, 8, 12), max_rank=r)
    assert attn.ranks == (1, 12, r, r, r, 12, 1)
    assert ffn1.ranks == (1, 12, r, r, r, 16, 1)
    assert (attn.tt_parameters(), ffn1.tt_parameters(), ffn2.tt_parameters()) == (
        20448,
        28960,
        28960,
    )
    encoder = 6 * (4 * attn.tt_parameters() + ffn1.tt_parameters() + ffn2.tt_parameters())
    assert encoder == 838272
    assert round(6 * (4 * 768 * 768 + 2 * 768 * 3072) / encoder, 1) == 50.7
    assert "compression=28.8x" in repr(attn)


def test_init_variance_is_one_over_in_plus_out():
    means = []
    for seed in range(40):
        torch.manual_seed(seed)
        layer = TTLinear(768, 768, in_modes=(12, 8, 8), out_modes=(8, 8, 12), max_rank=30)
        with torch.no_grad():
            means.append(layer.to_dense().double().pow(2).mean())
    assert abs(float(torch.stack(means).mean()) * (768 + 768) - 1) < 0.05


def test_automatic_modes_are_balanced_and_padded():
    layer = TTLinear(30522, 100, max_rank=4)
    assert math.prod(layer.in_modes) >= 30522 and len(layer.in_modes) == 4  # default_order
    assert layer.in_modes == tuple(sorted(layer.in_modes, reverse=True))
    assert "padding=" in repr(layer)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"in_features": 0, "out_features": 4, "max_rank": 2}, "in_features"),
        ({"in_features": 4, "out_features": -2, "max_rank": 2}, "out_features"),
        ({"in_features": 8, "out_features": 8, "max_rank": 0}, "max_rank"),
        ({"in_features": 8, "out_features": 8, "ranks": (2, 0, 2)}, "ranks"),
        ({"in_features": 8, "out_features": 8, "ranks": (2, 2)}, "ranks"),
        ({"in_features": 8, "out_features": 8, "max_rank": 2, "in_modes": (2, 3)}, "in_modes"),
        ({"in_features": 8, "out_features": 8, "max_rank": 2, "out_modes": (2, 0)}, "out_modes"),
        ({"in_features": 8, "out_features": 8, "max_rank": 2, "gate_threshold": -1}, "gate"),
        ({"in_features": 8, "out_features": 8, "max_rank": 2, "plan": "fast"}, "plan"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TTLinear(**kwargs)
