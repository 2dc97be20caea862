"""Penalties and on-device size against plain Python loops and autograd of the loop (float64)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.rank.penalty import PENALTIES, GateIndex
from engine.rank.shrink import shrink_model_
from engine.rank.size import model_size, tensorized_layers
from tests.engine.rank.models import Tiny, gates_of, kill_random_, randomize_gates_
from tests.engine.rank.references import reference_penalty, reference_weights
from tests.helpers.assertions import assert_close_rel


def check_against_reference(model, variant):
    index = GateIndex(model, variant)
    gates = gates_of(model)
    got = index.penalty()
    want = reference_penalty(model, variant)
    assert got.shape == ()
    assert_close_rel(got, torch.as_tensor(want), 1e-13, f"{variant} value")
    g_got = torch.autograd.grad(got, gates, allow_unused=True)
    if isinstance(want, torch.Tensor) and want.requires_grad:
        g_want = torch.autograd.grad(want, gates, allow_unused=True)
    else:
        g_want = [None] * len(gates)
    for gate, a, b in zip(gates, g_got, g_want, strict=True):
        a = torch.zeros_like(gate) if a is None else a
        b = torch.zeros_like(gate) if b is None else b
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-15), f"{variant} gradient {a} != {b}"
    assert float(index.size()) == model_size(model)
    live = [m for _, m in tensorized_layers(model) if min(m.active_ranks()) > 0]
    alive = sum(int((g > m.gate_threshold).sum()) for m in live for g in m.gates)
    assert int(index.active_entries()) == alive


@pytest.mark.parametrize("variant", PENALTIES)
@pytest.mark.parametrize("seed", range(8))
def test_penalty_value_gradient_and_size_match_loops(variant, seed):
    rng = random.Random(seed)
    model = Tiny()
    randomize_gates_(model, rng, p_dead=[0.0, 0.2, 0.5, 0.9][seed % 4])
    check_against_reference(model, variant)


@pytest.mark.parametrize("variant", PENALTIES)
def test_penalty_is_one_at_init_and_zero_when_everything_is_dead(variant):
    model = Tiny()
    index = GateIndex(model, variant)
    assert float(index.penalty().detach()) == pytest.approx(1.0, rel=1e-14)
    with torch.no_grad():
        for g in gates_of(model):
            g.fill_(-1.0)
    r = index.penalty()
    assert float(r.detach()) == 0.0 and torch.isfinite(r.detach())
    grads = torch.autograd.grad(r, gates_of(model))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    assert float(index.size()) == 0.0 and int(index.active_entries()) == 0


def test_cost_weighted_gradient_is_weight_over_total():
    model = Tiny()
    index = GateIndex(model)
    gates = gates_of(model)
    grads = torch.autograd.grad(index.penalty(), gates)
    # at init every rank is active: bond 0 of fc1 controls 4*1 + 3*4 entries of a 12x15 weight
    c = 4 * 1 + 3 * 4
    total = sum(sum(ws) for ws in reference_weights(model, "cost_weighted"))
    fc1_first = [g is model.fc1.gates[0] for g in gates].index(True)
    assert torch.allclose(grads[fc1_first], torch.full((3,), c / 180 / total, dtype=torch.float64))


def test_index_follows_shrinks_and_rejects_a_stale_state():
    rng = random.Random(3)
    model = Tiny()
    index = GateIndex(model, "cost_weighted")
    for _ in range(5):
        kill_random_(model, rng, 3)
        before = index.penalty().detach()
        if shrink_model_(model).changed:
            with pytest.raises(RuntimeError, match="refresh"):
                index.penalty()
            index.refresh()
        assert_close_rel(index.penalty().detach(), before, 1e-14, "penalty across shrink")
        check_against_reference(model, "cost_weighted")


@pytest.mark.parametrize("variant", PENALTIES)
def test_entries_of_a_zeroed_layer_are_inactive_so_a_shrink_changes_nothing(variant):
    model = Tiny()
    randomize_gates_(model, random.Random(5), p_dead=0.2)
    with torch.no_grad():
        model.head.gates[3].fill_(0.0)  # head is now identically zero
    index = GateIndex(model, variant)
    r, n = index.penalty(), index.active_entries()
    grads = torch.autograd.grad(r, list(model.head.gates))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    assert int(n) == sum(int((g > 1e-2).sum()) for m in (model.emb, model.fc1) for g in m.gates)
    r = r.detach()  # a graph alive across a shrink would keep stale gradient shapes
    shrink_model_(model)
    index.refresh()
    assert model.head.ranks == (1, 0, 0, 0, 0, 0, 1)
    assert_close_rel(index.penalty().detach(), r, 1e-14, "penalty across shrink")
    assert torch.equal(index.active_entries(), n)
    check_against_reference(model, variant)


def test_bad_variant_names_the_field():
    with pytest.raises(ValueError, match="compression.penalty"):
        GateIndex(Tiny(), "l1")


def test_model_without_tensorized_layers():
    index = GateIndex(torch.nn.Linear(3, 2))
    assert float(index.penalty()) == 0.0 and float(index.size()) == 0.0


def test_float32_gates_keep_their_dtype_and_threshold_rounding():
    model = Tiny(dtype=torch.float32)
    index = GateIndex(model)
    assert index.penalty().dtype == torch.float32
    assert index.size().dtype == torch.float64
    rng = random.Random(2)
    for _ in range(5):  # DEAD holds 0.01 = tau exactly, rounded to float32 on both sides
        randomize_gates_(model, rng, p_dead=0.3)
        assert float(index.size()) == model_size(model)


@pytest.mark.parametrize("variant", PENALTIES)
def test_penalty_and_size_trace_without_graph_breaks(variant):
    """``fullgraph=True`` fails on any host sync (``.item()``, ``int()``, data-dependent shape)."""
    model = Tiny()
    randomize_gates_(model, random.Random(1), p_dead=0.3)
    index = GateIndex(model, variant)

    def step():
        return index.penalty(), index.size(), index.active_entries()

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    r, s, n = compiled()
    r_want, s_want, n_want = step()
    assert torch.equal(r, r_want) and torch.equal(s, s_want) and torch.equal(n, n_want)
    assert r.requires_grad
