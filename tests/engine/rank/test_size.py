"""The size model S against the entries really stored after kills and shrinks."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.rank.penalty import GateIndex
from engine.rank.shrink import shrink_model_
from engine.rank.size import (
    layer_mode_sizes,
    layer_size,
    model_size,
    stored_size,
    tensorized_layers,
)
from tests.engine.rank.models import DT, Tiny, batch, kill_random_, randomize_gates_
from tests.helpers.assertions import assert_close_rel


def test_tensorized_layers_are_named_in_module_order():
    model = Tiny()
    names = [name for name, _ in tensorized_layers(model)]
    assert names == ["emb", "fc1", "head"]
    assert [name for name, _ in tensorized_layers(model.fc1)] == [""]
    assert tensorized_layers(nn.Linear(3, 4)) == []


def test_mode_sizes_count_every_core_entry_including_ttm_columns():
    model = Tiny()
    for _, layer in tensorized_layers(model):
        sizes = layer_mode_sizes(layer)
        ranks = layer.ranks
        for k, core in enumerate(layer.cores):  # docs/method.md#size-model: n_k m_k for TTM
            assert core.numel() == ranks[k] * sizes[k] * ranks[k + 1]
    assert layer_mode_sizes(model.emb) == (10, 6, 6)
    with pytest.raises(TypeError, match="TTLinear or TTMEmbedding"):
        layer_mode_sizes(nn.Linear(2, 2))


def test_size_at_init_is_the_stored_core_count():
    model = Tiny()
    cores = sum(c.numel() for _, m in tensorized_layers(model) for c in m.cores)
    assert model_size(model) == stored_size(model) == cores
    assert layer_size(model.emb) == model.emb.tt_parameters()


@pytest.mark.parametrize("seed", range(6))
def test_size_equals_live_stored_entries_after_any_kills_and_shrinks(seed):
    rng = random.Random(seed)
    model = Tiny()
    index = GateIndex(model)
    ids, _ = batch(seed)
    for _ in range(8):
        kill_random_(model, rng, rng.randrange(0, 4))
        predicted = model_size(model)
        assert float(index.size()) == predicted  # on device, before the shrink
        with torch.no_grad():
            before = model(ids)
        change = shrink_model_(model)
        if change.changed:
            index.refresh()
        stored = sum(c.numel() for _, m in tensorized_layers(model) for c in m.cores)
        assert stored_size(model) == stored == predicted == model_size(model)
        assert float(index.size()) == predicted
        with torch.no_grad():
            assert_close_rel(model(ids), before, 1e-12, "output across shrink")


@pytest.mark.parametrize("order", [2, 3, 5])
def test_standalone_layers_of_several_orders(order):
    rng = random.Random(order)
    lin = TTLinear(
        2**order, 3**order, in_modes=(2,) * order, out_modes=(3,) * order, max_rank=4, dtype=DT
    )
    emb = TTMEmbedding(
        3**order, 2**order, row_modes=(3,) * order, col_modes=(2,) * order, max_rank=4, dtype=DT
    )
    for layer in (lin, emb):
        while stored_size(layer) > 0:
            kill_random_(layer, rng, 2)
            want = layer_size(layer)
            shrink_model_(layer)
            assert stored_size(layer) == want == layer_size(layer)
            assert sum(c.numel() for c in layer.cores) == want


def test_dead_bond_zeroes_the_layer():
    model = Tiny()
    with torch.no_grad():
        model.fc1.gates[1].fill_(-1.0)
    assert layer_size(model.fc1) == 0
    assert model_size(model) == layer_size(model.emb) + layer_size(model.head)
    assert stored_size(model) > model_size(model)
    shrink_model_(model)
    assert model.fc1.ranks == (1, 0, 0, 0, 1)
    assert stored_size(model) == model_size(model)


def test_random_gate_states_against_a_plain_formula():
    rng = random.Random(7)
    model = Tiny()
    for _ in range(20):
        randomize_gates_(model, rng, p_dead=rng.random())
        total = 0
        for _, m in tensorized_layers(model):
            r = [1] + [sum(v > m.gate_threshold for v in g.tolist()) for g in m.gates] + [1]
            s = layer_mode_sizes(m)
            if min(r) > 0:
                total += sum(r[k] * s[k] * r[k + 1] for k in range(len(s)))
        assert model_size(model) == total
