"""Early and late objectives: values, the 0/1 switch, and gradients against autograd."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from engine.rank.objectives import early_objective, late_objective, late_switch
from engine.rank.penalty import PENALTIES, GateIndex
from tests.engine.rank.models import Tiny, batch, gates_of, randomize_gates_
from tests.engine.rank.references import reference_penalty, reference_weights
from tests.helpers.assertions import assert_close_rel

DT = torch.float64


@pytest.mark.parametrize("variant", PENALTIES)
def test_early_objective_gate_gradient_is_ce_gradient_plus_weighted_push(variant):
    model = Tiny()
    randomize_gates_(model, random.Random(11), p_dead=0.25)
    index = GateIndex(model, variant)
    ids, labels = batch(3)
    gates = gates_of(model)
    gamma = 0.3

    ce = F.cross_entropy(model(ids), labels)
    objective = early_objective(ce, index.penalty(), gamma)
    got = torch.autograd.grad(objective, gates)
    ce_grads = torch.autograd.grad(F.cross_entropy(model(ids), labels), gates, allow_unused=True)
    want_value = F.cross_entropy(model(ids), labels) + gamma * reference_penalty(model, variant)
    assert_close_rel(objective.detach(), want_value.detach(), 1e-13, "J_early value")
    want_all = torch.autograd.grad(want_value, gates)  # autograd of the plain-loop objective

    weights = reference_weights(model, variant)
    total = sum(
        w
        for g, ws in zip(gates, weights, strict=True)
        for w, v in zip(ws, g.tolist(), strict=True)
        if v > 1e-2
    )
    n_dead = 0
    for g, ws, a, c, b in zip(gates, weights, got, ce_grads, want_all, strict=True):
        c = torch.zeros_like(g) if c is None else c
        active = g.detach() > 1e-2
        push = torch.tensor(ws, dtype=DT) / total * active
        assert torch.allclose(a, c + gamma * push, rtol=1e-10, atol=1e-14)
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-14)
        assert torch.equal(a[~active], torch.zeros_like(a[~active]))  # dead: exactly 0
        n_dead += int((~active).sum())
    assert n_dead > 0  # the case exercises dead entries


def _loss_and_penalty():
    x = torch.tensor([0.6, 0.8], dtype=DT, requires_grad=True)
    loss = (x * x).sum()  # () = 1.0
    penalty = torch.sin(x).sum() / 3  # ()
    return x, loss, penalty


@pytest.mark.parametrize(("size", "lam_want"), [(100.0, 1.0), (21.0, 0.0)])
@pytest.mark.parametrize("tensor_refs", [False, True])
def test_late_objective_hand_set_values(size, lam_want, tensor_refs):
    gamma, loss_weight = 0.01, 0.1
    x, loss, penalty = _loss_and_penalty()
    loss_ref, size_ref = (
        (torch.tensor(0.8, dtype=DT), torch.tensor(20.0)) if tensor_refs else (0.8, 20.0)
    )
    size_t = torch.tensor(size, dtype=DT)
    # (L - L*) / L = 0.2 against (S - S*) / S = 0.8 (S = 100) or 1/21 (S = 21)
    lam = late_switch(loss, size_t, loss_ref, size_ref)
    assert lam.shape == () and not lam.requires_grad and lam.dtype == DT
    assert float(lam) == lam_want

    objective, lam2 = late_objective(
        loss, penalty, size_t, loss_ref, size_ref, gamma=gamma, loss_weight=loss_weight
    )
    assert float(lam2) == lam_want
    l_val, r_val = float(loss.detach()), float(penalty.detach())
    value = loss_weight * l_val + gamma * r_val + lam_want * r_val + (1 - lam_want) * l_val
    assert float(objective.detach()) == pytest.approx(value, rel=1e-14)

    (g_obj,) = torch.autograd.grad(objective, x, retain_graph=True)
    (g_loss,) = torch.autograd.grad(loss, x, retain_graph=True)
    (g_pen,) = torch.autograd.grad(penalty, x)
    want = (loss_weight + 1 - lam_want) * g_loss + (gamma + lam_want) * g_pen
    assert_close_rel(g_obj, want, 1e-14, "late gradient")


def test_late_switch_edges_and_defaults():
    one = torch.tensor(1.0, dtype=DT)
    # S = 0 (a fully pruned model): size gap -inf or NaN, so the step goes to the loss
    assert float(late_switch(one, torch.tensor(0.0, dtype=DT), 0.8, 20.0)) == 0.0
    assert float(late_switch(one, torch.tensor(0.0, dtype=DT), 0.8, 0.0)) == 0.0
    # below both references: the larger (less negative) gap wins; -0.5 vs -1.0, then -2 vs -0.1
    assert float(late_switch(one, torch.tensor(10.0, dtype=DT), 1.5, 20.0)) == 0.0
    assert float(late_switch(one, torch.tensor(10.0, dtype=DT), 3.0, 11.0)) == 1.0
    x, loss, penalty = _loss_and_penalty()
    objective, lam = late_objective(loss, penalty, torch.tensor(100.0), 0.8, 20.0)
    assert float(lam) == 1.0
    r = float(penalty.detach())
    assert float(objective.detach()) == pytest.approx(0.1 * 1.0 + 0.01 * r + r, rel=1e-14)


def test_objectives_trace_without_graph_breaks():
    model = Tiny()
    index = GateIndex(model)
    ids, labels = batch(0)
    logits = model(ids).detach().requires_grad_()  # the model itself is not under test here

    def step(loss_ref, size_ref):
        ce = F.cross_entropy(logits, labels)
        early = early_objective(ce, index.penalty(), 0.01)
        late, lam = late_objective(ce, index.penalty(), index.size(), loss_ref, size_ref)
        return early, late, lam

    refs = (torch.tensor(0.8, dtype=DT), torch.tensor(50.0, dtype=DT))
    eager = step(*refs)
    compiled = torch.compile(step, fullgraph=True, backend="eager")(*refs)
    for a, b in zip(compiled, eager, strict=True):
        assert torch.equal(a.detach(), b.detach())
