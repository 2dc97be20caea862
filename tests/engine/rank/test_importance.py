"""Loss-aware importance, the penalty's closed-form gradient, its floors and the auto gamma,
against autograd and brute-force loss changes (float64)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from engine.rank.auto_gamma import BETA, AutoGamma
from engine.rank.importance import GateImportance, task_gate_grad
from engine.rank.penalty import PENALTIES, GateIndex
from engine.rank.size import tensorized_layers
from tests.engine.rank.models import Tiny, batch, gates_of, randomize_gates_


def loss_of(model: Tiny, seed: int) -> torch.Tensor:
    ids, labels = batch(seed)
    return F.cross_entropy(model(ids), labels)


def task_grads(model: Tiny, seed: int) -> torch.Tensor:
    """dL/dg of the task loss alone, by autograd, flat in index order."""
    grads = torch.autograd.grad(loss_of(model, seed), gates_of(model), allow_unused=True)
    return torch.cat(
        [
            torch.zeros_like(g) if d is None else d
            for g, d in zip(gates_of(model), grads, strict=True)
        ]
    )


@pytest.mark.parametrize("variant", PENALTIES)
@pytest.mark.parametrize("seed", range(4))
def test_penalty_grad_is_autograd_of_the_penalty(variant, seed):
    model = Tiny()
    randomize_gates_(model, random.Random(seed), p_dead=0.3)
    index = GateIndex(model, variant)
    want = torch.autograd.grad(index.penalty(), gates_of(model), allow_unused=True)
    want = torch.cat(
        [
            torch.zeros_like(g) if w is None else w
            for g, w in zip(gates_of(model), want, strict=True)
        ]
    )
    assert torch.allclose(index.penalty_grad(), want, rtol=1e-13, atol=1e-16)


@pytest.mark.parametrize("coefs", [(1.0, 0.0), (1.0, 0.37), (0.1, 1.01), (1.1, 0.01)])
def test_task_gradient_is_recovered_from_the_objective_gradient(coefs):
    a, b = coefs
    model = Tiny()
    randomize_gates_(model, random.Random(5), p_dead=0.2)
    index = GateIndex(model)
    want = task_grads(model, 0)
    (a * loss_of(model, 0) + b * index.penalty()).backward()
    got = task_gate_grad(index, a, b)
    assert torch.allclose(got, want, rtol=1e-11, atol=1e-14)


def test_taylor_score_is_the_loss_change_of_shrinking_each_gate_brute_force():
    """|g dL/dg| is the first-order change of L when g_e moves towards 0: the brute-force
    central difference of L(g_e (1 - t)) at t = 0, per entry, averaged over batches."""
    model = Tiny()
    randomize_gates_(model, random.Random(3), p_dead=0.2)
    index = GateIndex(model)
    imp = GateImportance(index)
    seeds = (0, 1, 2)
    for seed in seeds:
        model.zero_grad(set_to_none=True)
        loss_of(model, seed).backward()
        imp.update()
    got = imp.scores()
    gates, t = gates_of(model), 1e-6
    brute = []
    with torch.no_grad():
        for g in gates:
            for e in range(g.numel()):
                v = float(g[e])
                per_batch = []
                for seed in seeds:
                    g[e] = v * (1 - t)
                    down = float(loss_of(model, seed))
                    g[e] = v * (1 + t)
                    up = float(loss_of(model, seed))
                    g[e] = v
                    per_batch.append(abs((up - down) / (2 * t)))  # |g dL/dg| by definition
                brute.append(sum(per_batch) / len(per_batch))
    brute_t = torch.tensor(brute, dtype=torch.float64)
    tau = torch.cat(
        [torch.full_like(g, m.gate_threshold) for _, m in tensorized_layers(model) for g in m.gates]
    )
    live = index.values() > tau  # dead entries have no gradient: score 0, brute force 0
    assert torch.allclose(got[live], brute_t[live], rtol=1e-5, atol=1e-9)
    assert torch.all(got[~live] == 0)
    assert int(imp.count) == len(seeds)


def test_cutting_the_lowest_score_costs_less_than_cutting_the_highest():
    torch.manual_seed(0)
    model = Tiny()
    index = GateIndex(model)
    imp = GateImportance(index)
    for seed in range(4):
        model.zero_grad(set_to_none=True)
        loss_of(model, seed).backward()
        imp.update()
    scores, values = imp.scores(), index.values()
    live = (values > 1e-2).nonzero().flatten()
    lo, hi = live[scores[live].argmin()], live[scores[live].argmax()]

    def cut_cost(entry: int) -> float:
        flat_pos, total = int(entry), 0.0
        for g in gates_of(model):
            if flat_pos < g.numel():
                with torch.no_grad():
                    old = float(g[flat_pos])
                    g[flat_pos] = 0.0
                    total = sum(abs(float(loss_of(model, s)) - base[s]) for s in range(4))
                    g[flat_pos] = old
                return total
            flat_pos -= g.numel()
        raise AssertionError

    with torch.no_grad():
        base = {s: float(loss_of(model, s)) for s in range(4)}
    assert cut_cost(int(lo)) < cut_cost(int(hi))


def test_importance_window_resets_and_reloads():
    model = Tiny()
    index = GateIndex(model)
    imp = GateImportance(index)
    loss_of(model, 0).backward()
    imp.update()
    state = {k: v.clone() for k, v in imp.state().items()}
    twin = GateImportance(index)
    twin.load(state)
    assert torch.equal(twin.scores(), imp.scores()) and int(twin.count) == 1
    imp.reset()
    assert int(imp.count) == 0 and torch.all(imp.scores() == 0)
    twin.load({"sums": torch.zeros(3, dtype=torch.float64), "count": torch.tensor(4)})
    assert int(twin.count) == 0  # another length: the entries changed, start anew


@pytest.mark.parametrize("variant", PENALTIES)
def test_protected_entries_get_no_penalty_and_the_rest_keep_their_weights(variant):
    model = Tiny()
    rng = random.Random(11)
    randomize_gates_(model, rng, p_dead=0.1)
    names = [n for n, _ in tensorized_layers(model)]
    floors = {n: tuple(rng.randint(0, 2) for _ in m.gates) for n, m in tensorized_layers(model)}
    plain, guarded = GateIndex(model, variant), GateIndex(model, variant)
    guarded.protect(floors)
    g_plain, g_guard = plain.penalty_grad(), guarded.penalty_grad()
    # reference: per bond, the floor largest live entries are exempt (ties: lower index first)
    exempt = []
    for name, m in tensorized_layers(model):
        for k, g in enumerate(m.gates):
            vals = g.detach().tolist()
            live = [e for e, v in enumerate(vals) if v > m.gate_threshold]
            top = sorted(live, key=lambda e: (-vals[e], e))[: floors[name][k]]
            exempt.extend(e in top for e in range(len(vals)))
    exempt_t = torch.tensor(exempt)
    assert torch.all(g_guard[exempt_t] == 0)
    rest = ~exempt_t & (g_plain != 0)
    ratio = g_guard[rest] / g_plain[rest]  # same weights, renormalized by a smaller sum
    assert torch.allclose(ratio, ratio[:1].expand_as(ratio), rtol=1e-12)
    autograd = torch.autograd.grad(guarded.penalty(), gates_of(model), allow_unused=True)
    autograd = torch.cat(
        [
            torch.zeros_like(g) if a is None else a
            for g, a in zip(gates_of(model), autograd, strict=True)
        ]
    )
    assert torch.allclose(g_guard, autograd, rtol=1e-13, atol=1e-16)
    assert names  # the model has tensorized layers


def test_auto_gamma_sets_the_penalty_push_to_a_share_of_the_task_push():
    model = Tiny()
    randomize_gates_(model, random.Random(2), p_dead=0.1)
    index = GateIndex(model)
    auto = AutoGamma(index, share=0.5)
    ema, ratios = 0.0, []
    for step, seed in enumerate(range(5), start=1):
        gamma = float(auto.gamma)
        model.zero_grad(set_to_none=True)
        (loss_of(model, seed) + auto.gamma * index.penalty()).backward()
        auto.update()
        dl = task_grads(model, seed)
        dr = index.penalty_grad()
        ratios.append(float(dl.norm() / dr.norm()))
        ema = BETA * ema + (1 - BETA) * ratios[-1]
        want = 0.5 * ema / (1 - BETA**step)
        assert float(auto.gamma) == pytest.approx(want, rel=1e-5), (step, gamma)
    assert auto.pace(size=10.0, bound=20.0) == pytest.approx(0.25)  # below the bound: halve
    assert auto.pace(size=30.0, bound=20.0) == pytest.approx(0.5)  # above: back up, capped
