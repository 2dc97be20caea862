"""shrink_model_: outputs kept, optimizer state sliced, and the AdamW trajectory unchanged."""

from __future__ import annotations

import copy
import json
import random

import torch
import torch.nn.functional as F

from engine.rank.objectives import early_objective
from engine.rank.penalty import GateIndex
from engine.rank.shrink import shrink_model_
from engine.rank.size import model_size, tensorized_layers
from tests.engine.rank.models import Tiny, batch
from tests.helpers.assertions import assert_close_rel


def _step(model, index, opt, seed):
    ids, labels = batch(seed)
    opt.zero_grad(set_to_none=True)
    loss = early_objective(F.cross_entropy(model(ids), labels), index.penalty(), 0.05)
    loss.backward()
    opt.step()
    return float(loss.detach())  # no graph survives the step (see shrink.py)


def _kill_same_entries_(full, shrunk, rng, n):
    """Kill ``n`` live entries of ``full`` and the same entries of its shrunk twin.

    The value -1 is far below tau, so leftover momentum cannot revive an entry of ``full``.
    """
    pairs = list(zip(tensorized_layers(full), tensorized_layers(shrunk), strict=True))
    for _ in range(n):
        live = [
            (a, b, k, e)
            for (_, a), (_, b) in pairs
            if min(a.active_ranks()) > 0
            for k, g in enumerate(a.gates)
            for e in range(g.numel())
            if g[e] > a.gate_threshold
        ]
        a, b, k, e = rng.choice(live)
        e_shrunk = int((a.gates[k][:e] > a.gate_threshold).sum())  # its index among survivors
        with torch.no_grad():
            a.gates[k][e] = -1.0
            b.gates[k][e_shrunk] = -1.0


def test_shrink_keeps_outputs_slices_adam_state_and_leaves_other_layers_alone():
    model = Tiny()
    index = GateIndex(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for s in range(3):
        _step(model, index, opt, s)
    with torch.no_grad():
        model.emb.gates[1][2] = -1.0
        model.fc1.gates[0][0] = 0.0
        model.fc1.gates[2][1] = 0.01  # exactly tau: dead
    ids, _ = batch(9)
    with torch.no_grad():
        before = model(ids)
    head_ptrs = [p.data_ptr() for p in model.head.parameters()]
    emb_g1 = model.emb.gates[1]
    saved = {p: {k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()}

    change = shrink_model_(model, opt)
    assert change.changed
    assert change.per_layer == {
        "emb": ((1, 3, 4, 1), (1, 3, 3, 1)),
        "fc1": ((1, 3, 4, 2, 1), (1, 2, 4, 1, 1)),
    }
    assert json.loads(json.dumps(change.to_dict()))["per_layer"]["emb"]["after"] == [1, 3, 3, 1]
    assert [p.data_ptr() for p in model.head.parameters()] == head_ptrs  # untouched
    assert model.emb.gates[1] is emb_g1  # same Parameter object, sliced in place
    with torch.no_grad():
        assert_close_rel(model(ids), before, 1e-12, "output across shrink")
    keep = {  # parameter -> (dim, kept indices) of the one slice it received
        model.emb.cores[1]: (3, [0, 1, 3]),
        model.emb.gates[1]: (0, [0, 1, 3]),
        model.emb.cores[2]: (0, [0, 1, 3]),
        model.fc1.cores[0]: (2, [1, 2]),
        model.fc1.gates[0]: (0, [1, 2]),
        model.fc1.cores[1]: (0, [1, 2]),
        model.fc1.cores[2]: (2, [0]),
        model.fc1.gates[2]: (0, [0]),
        model.fc1.cores[3]: (0, [0]),
    }
    for p in model.parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            want = saved[p][key]
            if p in keep:
                dim, idx = keep[p]
                want = want.index_select(dim, torch.tensor(idx))
            assert torch.equal(opt.state[p][key], want)
            assert opt.state[p][key].shape == p.shape
    assert not shrink_model_(model, opt).changed  # nothing left to cut


def test_training_with_shrinks_follows_the_unshrunk_trajectory():
    rng = random.Random(4)
    full = Tiny()
    shrunk = copy.deepcopy(full)
    runs = []
    for model in (full, shrunk):
        params = [
            {"params": [p for n, p in model.named_parameters() if ".gates." in n], "lr": 3e-2},
            {"params": [p for n, p in model.named_parameters() if ".gates." not in n]},
        ]
        runs.append((model, GateIndex(model), torch.optim.AdamW(params, lr=1e-2)))
    probe, _ = batch(100)
    changes = 0
    for step in range(12):
        if step in (2, 5, 6, 9):
            _kill_same_entries_(full, shrunk, rng, 3)
            if step == 6:  # a whole bond dies: fc1 becomes zero and is cut to rank 0
                with torch.no_grad():
                    full.fc1.gates[1].fill_(-1.0)
                    shrunk.fc1.gates[1].fill_(-1.0)
            model, index, opt = runs[1]
            if shrink_model_(model, opt).changed:
                changes += 1
                index.refresh()
        losses = [_step(model, index, opt, step) for model, index, opt in runs]
        assert abs(losses[0] - losses[1]) <= 1e-9 * abs(losses[0])
        with torch.no_grad():
            assert_close_rel(shrunk(probe), full(probe), 1e-6, f"logits at step {step}")
    assert changes >= 3 and shrunk.fc1.ranks == (1, 0, 0, 0, 1)
    assert model_size(full) == model_size(shrunk) < model_size(Tiny())
    for (_, a), (_, b) in zip(tensorized_layers(full), tensorized_layers(shrunk), strict=True):
        assert b.active_ranks() == b.ranks
        if min(a.active_ranks()) == 0:  # a zero layer is cut to rank 0 everywhere
            assert max(b.ranks[1:-1]) == 0
            continue
        assert a.active_ranks() == b.ranks
        for ga, gb in zip(a.gates, b.gates, strict=True):
            assert_close_rel(gb, ga[ga > a.gate_threshold], 1e-6, "live gate values")
