"""Parameter groups by the stated rule, each method's optimizer, and the pure LR schedule."""

from __future__ import annotations

import math

import pytest
from torch import nn

from engine.models.registry import TensorizeOptions
from engine.models.transformer import TransformerConfig, build_transformer
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.train.config import GaloreConfig, LearningRates, StageConfig
from engine.train.optim import build_optimizer, get_lr, group_parameters

CFG = TransformerConfig.tiny(n_layers=1)


def _ids(pairs):
    return {id(p) for _, p in pairs}


def test_comera_groups_follow_the_rule():
    model = build_transformer(CFG, tensorized=True, max_rank=4, shapes="auto")
    groups = group_parameters(model)
    tt = [m for m in model.modules() if isinstance(m, TTLinear | TTMEmbedding)]
    assert _ids(groups["cores"]) == {id(p) for m in tt for p in m.cores}
    assert _ids(groups["gates"]) == {id(p) for m in tt for p in m.gates}
    every = {id(p) for p in model.parameters()}
    assert _ids(groups["others"]) == every - _ids(groups["cores"]) - _ids(groups["gates"])
    opt = build_optimizer(
        model, "comera", LearningRates(1e-4, 1e-3, 5e-5), options=TensorizeOptions()
    )
    assert {g["name"]: g["lr"] for g in opt.param_groups} == {
        "cores": 1e-4,
        "gates": 1e-3,
        "others": 5e-5,
    }


def test_dense_groups_take_selected_weights_as_cores():
    model = build_transformer(CFG, tensorized=False)
    groups = group_parameters(model, TensorizeOptions(layers=("encoder.*",)))
    expect = {
        id(m.weight)
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n.startswith("encoder.")
    }
    assert _ids(groups["cores"]) == expect
    assert not groups["gates"]


def test_galore_projects_linear_weights_only():
    model = build_transformer(CFG, tensorized=False)
    opt = build_optimizer(
        model,
        "galore",
        LearningRates(),
        options=TensorizeOptions(),
        galore=GaloreConfig(rank=4, update_proj_gap=7, scale=0.5),
    )
    projected = [g for g in opt.param_groups if "rank" in g]
    assert len(projected) == 1 and projected[0]["rank"] == 4
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    assert {id(p) for p in projected[0]["params"]} == linear
    emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    plain = {id(p) for g in opt.param_groups if "rank" not in g for p in g["params"]}
    assert emb <= plain


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_get_lr_matches_the_formula(schedule):
    stage = StageConfig(kind="early", steps=100, lr_schedule=schedule, warmup_steps=10)
    assert get_lr(2.0, 0, stage, 100) == pytest.approx(0.2)
    assert get_lr(2.0, 9, stage, 100) == pytest.approx(2.0)
    for step in (10, 40, 99):
        expect = (
            2.0
            if schedule == "constant"
            else 2.0 * 0.5 * (1 + math.cos(math.pi * (step - 10) / 90))
        )
        assert get_lr(2.0, step, stage, 100) == pytest.approx(expect)
