"""rank_snapshot and compression_summary: JSON-safe, and consistent with the stored model."""

from __future__ import annotations

import json

import torch

from engine.rank.shrink import shrink_model_
from engine.rank.size import model_size
from engine.rank.trajectory import compression_summary, rank_snapshot
from tests.engine.rank.models import Tiny


def test_snapshot_rows_describe_each_layer():
    model = Tiny()
    with torch.no_grad():
        model.fc1.gates[0][1] = -1.0
        model.head.gates[0].fill_(0.0)  # head is zero
    snap = json.loads(json.dumps(rank_snapshot(model), allow_nan=False))
    assert list(snap) == ["emb", "fc1", "head"]
    assert snap["emb"] == {
        "kind": "ttm_embedding",
        "modes": [[5, 3, 2], [2, 2, 3]],
        "ranks": [1, 3, 4, 1],
        "active_ranks": [1, 3, 4, 1],
        "params": 1 * 10 * 3 + 3 * 6 * 4 + 4 * 6 * 1,
        "dense": 29 * 12,
        "ratio": 29 * 12 / 126,
    }
    fc1 = snap["fc1"]
    assert fc1["kind"] == "tt_linear" and fc1["modes"] == [[4, 3], [3, 5]]
    assert fc1["ranks"] == [1, 3, 4, 2, 1] and fc1["active_ranks"] == [1, 2, 4, 2, 1]
    assert fc1["params"] == 4 * 2 + 2 * 3 * 4 + 4 * 3 * 2 + 2 * 5
    assert fc1["dense"] == 180 and fc1["ratio"] == 180 / fc1["params"]
    assert snap["head"]["params"] == 0 and snap["head"]["ratio"] is None
    assert snap["head"]["active_ranks"][1] == 0


def test_summary_totals_match_the_parameters_really_stored_after_a_shrink():
    model = Tiny()
    with torch.no_grad():
        model.emb.gates[1][:2] = -1.0
        model.fc1.gates[2][0] = 0.0
    before = compression_summary(model)
    shrink_model_(model)
    after = compression_summary(model)
    assert json.dumps(after, allow_nan=False)
    for key in (
        "tensorized_params",
        "model_params",
        "model_params_dense",
        "tensorized_ratio",
        "active_gate_entries",
        "other_params",
    ):
        assert after[key] == before[key]
    assert before["tensorized_stored"] > after["tensorized_stored"] == after["tensorized_params"]
    gates = sum(g.numel() for n, g in model.named_parameters() if ".gates." in n)
    every = sum(p.numel() for p in model.parameters())
    assert after["model_params"] == every - gates  # exported model: gates folded away
    assert after["gate_entries"] == after["active_gate_entries"] == gates
    assert after["tensorized_params"] == model_size(model)
    dense_model = (29 * 12) + (12 * 15 + 15) + (15 * 8 + 8) + (8 * 5 + 5)
    assert after["model_params_dense"] == dense_model
    assert after["model_ratio"] == dense_model / after["model_params"]
    assert after["tensorized_layers"] == 3


def test_summary_of_a_fully_pruned_model_has_no_infinite_ratio():
    model = Tiny()
    with torch.no_grad():
        for m in (model.emb, model.fc1, model.head):
            m.gates[0].fill_(-1.0)
    summary = compression_summary(model)
    assert summary["tensorized_params"] == 0 and summary["tensorized_ratio"] is None
    assert summary["active_gate_entries"] == 0 < summary["gate_entries"]
    assert summary["model_ratio"] == summary["model_params_dense"] / summary["other_params"]
    json.dumps(summary, allow_nan=False)
