"""compress_: module swap, summaries, overrides, filters, init modes and config round trips."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from engine.compress import CompressConfig, LayerOverride, compress_
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.tt.shapes import bond_rank_bounds
from tests.helpers.assertions import assert_close_rel

FULL = 10_000  # a max_rank above every bond bound: exact TT-SVD


class Net(nn.Module):
    """Embedding -> three linears (one padded size, one tiny head)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(97, 24)  # 97 is prime: rows are padded
        self.body = nn.Sequential(nn.Linear(24, 60), nn.GELU(), nn.Linear(60, 36))
        self.head = nn.Linear(36, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.emb(ids)))  # (B, S, 3)


def ids(b: int = 4, s: int = 9) -> torch.Tensor:
    return torch.randint(0, 97, (b, s))


def test_replaces_every_layer_and_summary_matches_modules():
    net = Net()
    summary = compress_(net, CompressConfig(max_rank=4))
    assert isinstance(net.emb, TTMEmbedding)
    assert isinstance(net.body[0], TTLinear) and isinstance(net.body[2], TTLinear)
    assert isinstance(net.head, TTLinear) and isinstance(net.body[1], nn.GELU)
    assert [r.name for r in summary.layers] == ["emb", "body.0", "body.2", "head"]
    assert summary.skipped == ()
    for row in summary.layers:
        mod = net.get_submodule(row.name)
        assert row.tt_params == mod.tt_parameters() == sum(c.numel() for c in mod.cores)
        assert row.dense_params == mod.dense_parameters()
        assert row.gate_params == sum(g.numel() for g in mod.gates)
        assert row.ranks == tuple(mod.ranks) and max(row.ranks) <= 4
    emb = summary.layers[0]
    assert emb.kind == "embedding" and emb.in_modes == net.emb.row_modes
    assert emb.padding[1] == 0 and emb.padding[0] == math.prod(emb.in_modes) - 97 > 0
    assert summary.dense_params == 97 * 24 + 24 * 60 + 60 * 36 + 36 * 3
    assert summary.tt_params == sum(r.tt_params for r in summary.layers)
    assert summary.model_params_after == sum(p.numel() for p in net.parameters())
    assert summary.model_params_before == 97 * 24 + 24 * 60 + 60 + 60 * 36 + 36 + 36 * 3 + 3
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["totals"]["tt_params"] == summary.tt_params
    text = str(summary)
    assert "body.2" in text and f"{summary.tt_params:,}" in text
    assert net(ids()).shape == (4, 9, 3)


def test_svd_full_rank_reproduces_outputs_float64():
    net = Net().double()
    x = ids()
    expected = net(x)
    compress_(net, CompressConfig(max_rank=FULL))
    for mod in (net.emb, net.body[0], net.body[2], net.head):
        assert all(p.dtype == torch.float64 for p in mod.parameters())
    assert_close_rel(net(x), expected, 1e-8, "full-rank TT-SVD")


def test_svd_truncated_ranks_and_tol():
    net = Net().double()
    compress_(net, CompressConfig(max_rank=3, embedding_max_rank=5))
    assert max(net.body[0].ranks) == 3 and max(net.emb.ranks) == 5
    net2 = Net().double()
    compress_(net2, CompressConfig(max_rank=FULL, tol=1e-12))
    assert net2.body[0].to_dense().shape == (60, 24)


def _mean_sq(build, n_seeds: int) -> float:
    vals = []
    for seed in range(n_seeds):
        torch.manual_seed(seed)
        vals.append(build().detach().pow(2).mean())
    return float(torch.stack(vals).mean())


def test_random_init_variance_scale():
    cfg = CompressConfig(init="random", max_rank=8)

    def linear_weight():
        seq = nn.Sequential(nn.Linear(48, 64, dtype=torch.float64))
        compress_(seq, cfg)
        return seq[0].to_dense()  # (64, 48)

    def table():
        seq = nn.Sequential(nn.Embedding(100, 16, dtype=torch.float64))
        compress_(seq, cfg)
        return seq[0].to_dense()  # (100, 16)

    assert _mean_sq(linear_weight, 60) == pytest.approx(1 / (48 + 64), rel=0.15)
    assert _mean_sq(table, 60) == pytest.approx(1.0, rel=0.15)


def test_random_init_keeps_dtype_bias_flag_and_exact_ranks():
    net = nn.Sequential(nn.Linear(24, 60, bias=False, dtype=torch.float64))
    ov = {"0": LayerOverride(ranks=(2, 3, 4))}
    compress_(net, CompressConfig(init="random", overrides=ov))
    assert net[0].bias is None and net[0].ranks == (1, 2, 3, 4, 1)
    assert net[0].cores[0].dtype == torch.float64


def test_overrides_exact_name_beats_pattern_and_first_pattern_wins():
    ov = {
        "body.*": LayerOverride(max_rank=2),
        "body.2": LayerOverride(in_modes=(6, 10), out_modes=(6, 6), max_rank=5),
        "*": LayerOverride(max_rank=3),
        "emb": LayerOverride(row_modes=(10, 10), col_modes=(4, 6)),
    }
    net = Net()
    compress_(net, CompressConfig(max_rank=7, overrides=ov))
    assert max(net.body[0].ranks) == 2  # first matching pattern
    assert net.body[2].in_modes == (6, 10) and net.body[2].out_modes == (6, 6)
    assert max(net.body[2].ranks) == 5  # exact name beats both patterns
    assert max(net.head.ranks) == 3  # "*" pattern
    assert net.emb.row_modes == (10, 10) and net.emb.col_modes == (4, 6)


def test_ranks_override_with_svd_caps_each_bond():
    net = Net().double()
    ov = {"body.0": LayerOverride(ranks=(3, 5, 2))}
    compress_(net, CompressConfig(max_rank=FULL, overrides=ov))
    assert net.body[0].ranks == (1, 3, 5, 2, 1)  # per-bond caps, max_rank not used
    assert max(net.body[2].ranks) > 5
    seq = nn.Sequential(nn.Linear(24, 60, dtype=torch.float64))
    xin = torch.randn(5, 24, dtype=torch.float64)
    ref = seq(xin)
    probe = TTLinear(24, 60, max_rank=1, device="meta")
    bounds = bond_rank_bounds(probe.mode_sizes)  # caps at the bounds: exact TT-SVD
    compress_(seq, CompressConfig(max_rank=1, overrides={"0": LayerOverride(ranks=bounds)}))
    assert seq[0].ranks == (1, *bounds, 1)
    assert_close_rel(seq(xin), ref, 1e-8, "per-bond caps at the bounds")


def test_filter_fn_skip_and_min_features():
    net = Net()
    seen = []

    def only_body(mod: nn.Module, fqn: str) -> bool:
        seen.append(fqn)
        return fqn.startswith("body")

    ov = {"body.2": LayerOverride(skip=True)}
    summary = compress_(net, CompressConfig(overrides=ov), only_body)
    assert isinstance(net.body[0], TTLinear)
    assert type(net.body[2]) is nn.Linear and type(net.head) is nn.Linear
    assert type(net.emb) is nn.Embedding
    reasons = {s.name: s.reason for s in summary.skipped}
    assert reasons["body.2"] == "override skip=True"
    assert "filter_fn" in reasons["head"] and "filter_fn" in reasons["emb"]
    assert "body.2" not in seen  # skip is decided before filter_fn

    net = Net()
    summary = compress_(net, CompressConfig(min_features=10, embedding=False))
    assert type(net.head) is nn.Linear and "min_features" in summary.skipped[-1].reason
    assert type(net.emb) is nn.Embedding and isinstance(net.body[2], TTLinear)
    net = Net()
    compress_(net, CompressConfig(linear=False))
    assert isinstance(net.emb, TTMEmbedding) and type(net.head) is nn.Linear


def test_idempotent_shared_tied_and_mha():
    net = Net()
    compress_(net, CompressConfig(max_rank=3))
    again = compress_(net, CompressConfig(max_rank=3))
    assert again.layers == () and again.model_params_before == again.model_params_after

    shared = nn.Linear(16, 16)
    seq = nn.Sequential(shared, nn.ReLU(), shared)
    summary = compress_(seq, CompressConfig(max_rank=3))
    assert len(summary.layers) == 1 and seq[0] is seq[2] and isinstance(seq[0], TTLinear)

    tied = nn.ModuleDict({"emb": nn.Embedding(20, 16), "lm": nn.Linear(16, 20, bias=False)})
    tied["lm"].weight = tied["emb"].weight
    summary = compress_(tied, CompressConfig(max_rank=3))
    assert summary.layers == () and all("tied" in s.reason for s in summary.skipped)

    block = nn.ModuleDict(
        {"mha": nn.MultiheadAttention(16, 2, batch_first=True), "proj": nn.Linear(16, 16)}
    )
    summary = compress_(block, CompressConfig(max_rank=3))
    assert type(block["mha"].out_proj) is not TTLinear and isinstance(block["proj"], TTLinear)
    x = torch.randn(2, 5, 16)
    assert block["mha"](x, x, x)[0].shape == (2, 5, 16)


def test_keeps_training_mode_and_requires_grad():
    net = Net().eval()
    net.body[0].weight.requires_grad_(False)
    net.body[0].bias.requires_grad_(False)
    compress_(net, CompressConfig(max_rank=3))
    assert not net.body[0].training and not net.emb.training
    assert not any(p.requires_grad for p in net.body[0].parameters())
    assert all(p.requires_grad for p in net.head.parameters())


def test_errors_name_the_layer_and_leave_the_model_untouched():
    net = Net()
    bad = {"body.0": LayerOverride(in_modes=(2, 3), out_modes=(6, 10))}  # 6 < 24
    with pytest.raises(ValueError, match="body.0"):
        compress_(net, CompressConfig(overrides=bad))
    assert all(type(m) is not TTLinear for m in net.modules())
    with pytest.raises(ValueError, match="names no nn.Linear"):
        compress_(net, CompressConfig(overrides={"bdy.0": LayerOverride(max_rank=2)}))
    with pytest.raises(ValueError, match="row_modes"):
        compress_(net, CompressConfig(overrides={"head": LayerOverride(row_modes=(6, 6))}))
    with pytest.raises(TypeError, match="CompressConfig"):
        compress_(net, {"max_rank": 3})  # type: ignore[arg-type]
    compress_(net, CompressConfig(overrides={"nothing.*": LayerOverride(max_rank=2)}))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_rank", 0),
        ("max_rank", 2.5),
        ("max_rank", True),
        ("embedding_max_rank", 0),
        ("gate_threshold", -0.1),
        ("gate_threshold", 1.0),
        ("d", 1),
        ("init", "xavier"),
        ("tol", -1.0),
        ("linear", 1),
        ("embedding", "yes"),
        ("min_features", 0),
        ("overrides", [1, 2]),
        ("version", 2),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        CompressConfig(**{field: value})


def test_config_cross_field_and_override_validation():
    with pytest.raises(ValueError, match="tol"):
        CompressConfig(init="random", tol=1e-3)
    given = {"a": {"max_rank": 2}}  # a mapping is read as the LayerOverride it describes
    assert CompressConfig(overrides=given).overrides == {"a": LayerOverride(max_rank=2)}  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^overrides\['a'\]\.max_rank: must be an integer >= 1"):
        CompressConfig(overrides={"a": {"max_rank": 0}})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="^overrides: must be an object"):
        CompressConfig(overrides=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_rank"):
        LayerOverride(max_rank=0)
    with pytest.raises(ValueError, match="in_modes"):
        LayerOverride(in_modes=(2, 0))
    with pytest.raises(ValueError, match="out_modes: must have the length of in_modes"):
        LayerOverride(in_modes=(2, 3), out_modes=(2, 3, 4))
    with pytest.raises(ValueError, match="skip"):
        LayerOverride(skip=1)  # type: ignore[arg-type]


def test_config_round_trip_through_json():
    cfg = CompressConfig(
        max_rank=12,
        embedding_max_rank=32,
        gate_threshold=0.05,
        d=3,
        tol=1e-3,
        min_features=8,
        overrides={
            "enc.*.q": LayerOverride(in_modes=(12, 8, 8), ranks=(4, 5)),
            "cls": LayerOverride(skip=True),
        },
    )
    data = json.loads(json.dumps(cfg.to_dict()))
    assert data["version"] == 1 and data["overrides"]["enc.*.q"]["in_modes"] == [12, 8, 8]
    back = CompressConfig.from_dict(data)
    assert back == cfg and list(back.overrides) == ["enc.*.q", "cls"]
    assert CompressConfig.from_dict(CompressConfig().to_dict()) == CompressConfig()


def test_from_dict_rejects_unknown_keys_and_versions():
    data = CompressConfig().to_dict()
    with pytest.raises(ValueError, match="unknown field"):
        CompressConfig.from_dict({**data, "rank": 3})
    with pytest.raises(ValueError, match="version"):
        CompressConfig.from_dict({**data, "version": 2})
    with pytest.raises(ValueError, match="version"):
        CompressConfig.from_dict({k: v for k, v in data.items() if k != "version"})
    with pytest.raises(ValueError, match="unknown field"):
        CompressConfig.from_dict({**data, "overrides": {"a": {"modes": [2]}}})
