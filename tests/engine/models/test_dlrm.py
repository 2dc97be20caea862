"""DLRM: dot interaction against a brute-force loop, layer selection, init, config checks."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from engine.models.dlrm import (
    DLRM,
    KAGGLE_TABLE_SIZES,
    DLRMConfig,
    build_dlrm,
    dot_interaction,
)
from engine.models.tensorize import TensorizeOptions
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from tests.helpers.assertions import assert_close_rel


def tt_names(model: nn.Module) -> set[str]:
    return {n for n, m in model.named_modules() if isinstance(m, TTLinear | TTMEmbedding)}


def inputs(cfg: DLRMConfig, b: int, dtype=torch.float32):
    dense = torch.randn(b, cfg.n_dense, dtype=dtype)
    sparse = torch.stack([torch.randint(0, n, (b,)) for n in cfg.table_sizes], dim=1)
    return dense, sparse


def test_dot_interaction_against_a_double_loop():
    b, d, n = 3, 5, 4
    x = torch.randn(b, d, dtype=torch.float64)
    es = [torch.randn(b, d, dtype=torch.float64) for _ in range(n)]
    out = dot_interaction(x, es)
    vs = [x, *es]
    ref = torch.empty(b, d + (n + 1) * n // 2, dtype=torch.float64)
    for r in range(b):
        row = list(x[r])
        for i in range(n + 1):  # Facebook's order: for i, for j < i
            for j in range(i):
                row.append(sum(vs[i][r, k] * vs[j][r, k] for k in range(d)))
        ref[r] = torch.stack([torch.as_tensor(v) for v in row])
    assert_close_rel(out, ref, 1e-14, "dot interaction")


@pytest.mark.parametrize("tensorized", [False, True])
def test_forward_uses_bottom_tables_and_top(tensorized):
    cfg = DLRMConfig.tiny()
    model = build_dlrm(cfg, tensorized=tensorized, options=TensorizeOptions(max_rank=4)).double()
    dense, sparse = inputs(cfg, 5, torch.float64)
    out = model(dense, sparse)
    assert out.shape == (5,) and out.dtype == torch.float64
    x = model.bottom(dense)  # (B, D) after a final ReLU
    assert x.shape == (5, cfg.embedding_dim) and (x >= 0).all()
    es = [t(sparse[:, j]) for j, t in enumerate(model.embeddings)]
    manual = model.top(dot_interaction(x, es)).squeeze(1)
    assert torch.equal(out, manual)
    assert model.top[0].in_features == cfg.interaction_dim == 8 + 5 * 4 // 2
    # changing one categorical id changes only the rows that hold it
    sparse2 = sparse.clone()
    sparse2[2, 1] = (sparse[2, 1] + 1) % cfg.table_sizes[1]
    diff = (model(dense, sparse2) - out).abs()
    assert diff[2] > 0 and diff[[0, 1, 3, 4]].max() == 0


def test_shape_errors():
    cfg = DLRMConfig.tiny()
    model = DLRM(cfg)
    dense, sparse = inputs(cfg, 2)
    with pytest.raises(ValueError, match="dense"):
        model(dense[:, :5], sparse)
    with pytest.raises(ValueError, match="sparse"):
        model(dense, sparse[:, :2])
    with pytest.raises(IndexError):
        model(dense, sparse + 1000)


def test_default_layer_choice_follows_min_size():
    """tiny: bottom 13->96 (1248) TT, 96->8 (768) dense; tables 300x8, 200x8 TTM, 7x8, 50x8
    dense; top 18->64 (1152) TT, 64->1 dense."""
    model = build_dlrm(DLRMConfig.tiny(), tensorized=True, options=TensorizeOptions(max_rank=4))
    assert tt_names(model) == {"bottom.0", "embeddings.0", "embeddings.2", "top.0"}
    assert {s.name for s in model.tensorize_report.skipped} == {
        "bottom.1",
        "embeddings.1",
        "embeddings.3",
        "top.1",
    }
    assert type(model.embeddings[1]) is nn.Embedding and type(model.top[1]) is nn.Linear


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        (("embeddings.*",), {f"embeddings.{j}" for j in range(4)}),
        (("bottom.*", "top.*"), {"bottom.0", "bottom.1", "top.0", "top.1"}),
        (("embeddings.2", "top.1"), {"embeddings.2", "top.1"}),
    ],
)
def test_layer_patterns(layers, expected):
    model = build_dlrm(
        DLRMConfig.tiny(),
        tensorized=True,
        options=TensorizeOptions(max_rank=4, layers=layers, min_size=1),
    )
    assert tt_names(model) == expected
    dense, sparse = inputs(DLRMConfig.tiny(), 3)
    assert model(dense, sparse).shape == (3,)


def test_table_init_matches_dlrm_variance():
    """Entries of variance 1 / (3 n) for dense and TTM tables alike (DLRM's U(+-1/sqrt(n)))."""
    cfg = DLRMConfig.tiny(table_sizes=(4096, 2000), embedding_dim=16)
    dense = build_dlrm(cfg, tensorized=False)
    for n, t in zip(cfg.table_sizes, dense.embeddings, strict=True):
        assert t.weight.abs().max() <= n**-0.5
        assert 0.8 < float(t.weight.detach().pow(2).mean()) * 3 * n < 1.2
    ratios = []
    for seed in range(4):
        torch.manual_seed(seed)
        model = build_dlrm(cfg, tensorized=True, options=TensorizeOptions(max_rank=8))
        for n, t in zip(cfg.table_sizes, model.embeddings, strict=True):
            assert isinstance(t, TTMEmbedding)
            ratios.append(float(t.to_dense().detach().pow(2).mean()) * 3 * n)
    mean = sum(ratios) / len(ratios)
    assert 0.7 < mean < 1.4, ratios  # a TT table's sample variance scatters; 1 expected


def test_kaggle_defaults():
    cfg = DLRMConfig.kaggle()
    assert cfg.n_dense == 13 and cfg.n_tables == 26 and cfg.embedding_dim == 16
    assert sum(cfg.table_sizes) == 33_762_577 and cfg.table_sizes == KAGGLE_TABLE_SIZES
    assert cfg.interaction_dim == 16 + 27 * 26 // 2 == 367
    model = DLRM(cfg.replace(table_sizes=(10,) * 26))  # the real tables are 2 GB dense
    widths = [(m.in_features, m.out_features) for m in (*model.bottom, *model.top)]
    assert widths == [(13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (512, 256), (256, 1)]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_dense", 0),
        ("table_sizes", ()),
        ("table_sizes", (5, -1)),
        ("table_sizes", "12"),
        ("embedding_dim", 2.0),
        ("bottom_widths", (0,)),
        ("top_widths", None),
        ("version", 0),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DLRMConfig(**{field: value})


def test_config_round_trip():
    cfg = DLRMConfig.tiny(bottom_widths=(), top_widths=(4, 4))
    data = json.loads(json.dumps(cfg.to_dict()))
    assert data["table_sizes"] == [300, 7, 200, 50]
    assert DLRMConfig.from_dict(data) == cfg
    with pytest.raises(ValueError, match="unknown field"):
        DLRMConfig.from_dict({**data, "tables": 3})
    with pytest.raises(ValueError, match="version"):
        DLRMConfig.from_dict({k: v for k, v in data.items() if k != "version"})
    assert DLRM(cfg).bottom[0].in_features == 13 and len(DLRM(cfg).bottom) == 1
