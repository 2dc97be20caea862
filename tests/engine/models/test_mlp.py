"""MLP classifier: the computation against plain torch, flattening, dropout, layers, config."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.models.mlp import MLPClassifier, MLPConfig, MLPStack, build_mlp
from engine.models.tensorize import TensorizeOptions
from engine.nn.tt_linear import TTLinear
from tests.helpers.assertions import assert_close_rel


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_forward_matches_plain_torch(activation):
    cfg = MLPConfig.tiny(activation=activation)
    model = MLPClassifier(cfg).double().eval()
    x = torch.randn(6, 48, dtype=torch.float64)
    act = F.gelu if activation == "gelu" else F.relu
    h = x
    for lin in model.hidden:
        h = act(h @ lin.weight.T + lin.bias)
    ref = h @ model.out.weight.T + model.out.bias
    assert_close_rel(model(x), ref, 1e-13, "MLP forward")
    # (B, ...) inputs are flattened
    assert torch.equal(model(x.view(6, 3, 4, 4)), model(x))


def test_dropout_only_in_training():
    model = MLPClassifier(MLPConfig.tiny(dropout=0.5))
    x = torch.randn(8, 48)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))


def test_hidden_layers_are_tensorized_and_the_output_stays_dense():
    cfg = MLPConfig.tiny(hidden=(64, 32, 40))
    model = build_mlp(cfg, tensorized=True, options=TensorizeOptions(max_rank=4))
    # 48x64 = 3072 and 64x32 = 2048 are tensorized, 32x40 = 1280 too; out (40x5) never
    assert [type(m) for m in model.hidden] == [TTLinear, TTLinear, TTLinear]
    assert type(model.out) is nn.Linear and model.out.out_features == 5
    assert model.tensorize_report.tensorized == ("hidden.0", "hidden.1", "hidden.2")
    picked = build_mlp(
        cfg, tensorized=True, options=TensorizeOptions(max_rank=4, layers=["hidden.1"])
    )
    assert [type(m) for m in picked.hidden] == [nn.Linear, TTLinear, nn.Linear]
    small = build_mlp(cfg, tensorized=True, options=TensorizeOptions(max_rank=4, min_size=2048))
    assert [type(m) for m in small.hidden] == [TTLinear, TTLinear, nn.Linear]
    with pytest.raises(ValueError, match="layers: pattern 'out'"):
        build_mlp(cfg, tensorized=True, options=TensorizeOptions(layers=["out"]))


def test_mlp_stack_last_activation():
    stack = MLPStack((3, 4, 2), activation="relu", last_activation=False).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    h = F.relu(stack[0](x))
    assert torch.equal(stack(x), stack[1](h))
    stack.last_activation = True
    assert torch.equal(stack(x), F.relu(stack[1](h)))


def test_input_checks():
    model = MLPClassifier(MLPConfig.tiny())
    with pytest.raises(ValueError, match="in_features=48"):
        model(torch.randn(2, 47))
    with pytest.raises(ValueError, match="x must be"):
        model(torch.randn(48))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("in_features", 0),
        ("hidden", ()),
        ("hidden", (8, 0)),
        ("hidden", "64"),
        ("num_classes", 1.5),
        ("activation", "tanh"),
        ("dropout", 1.0),
        ("version", 2),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        MLPConfig(**{field: value})


def test_config_round_trip():
    cfg = MLPConfig.tiny(hidden=[16, 8])
    assert cfg.hidden == (16, 8)
    data = json.loads(json.dumps(cfg.to_dict()))
    assert MLPConfig.from_dict(data) == cfg
    with pytest.raises(ValueError, match="unknown field"):
        MLPConfig.from_dict({**data, "depth": 2})
    with pytest.raises(ValueError, match="version"):
        MLPConfig.from_dict({k: v for k, v in data.items() if k != "version"})
