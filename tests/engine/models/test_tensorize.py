"""Layer selection by name: options, slots, min_size, specialization and the report."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from engine.models.tensorize import (
    MIN_BREAK_EVEN_RANK,
    Slot,
    TensorizeOptions,
    TensorizeReport,
    break_even_rank,
    embedding_slot,
    linear_slot,
    materialize,
    tensorize_report,
)
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.summary import SkippedLayer


class Toy(nn.Module):
    """Slots at three depths; ``small`` has 16 x 32 = 512 weights, ``emb`` 64 x 16 = 1024."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = embedding_slot(64, 16)
        self.blocks = nn.ModuleList(
            [nn.ModuleDict({"fc": linear_slot(32, 48), "norm": nn.LayerNorm(48)}) for _ in range(2)]
        )
        self.small = linear_slot(16, 32, bias=False, role="tiny")
        self.head = nn.Linear(48, 3)  # never a candidate


def tt_names(model: nn.Module) -> set[str]:
    return {n for n, m in model.named_modules() if isinstance(m, TTLinear | TTMEmbedding)}


@pytest.mark.parametrize(
    ("layers", "min_size", "expected", "too_small"),
    [
        (("*",), 1024, {"emb", "blocks.0.fc", "blocks.1.fc"}, {"small"}),
        (("*",), 1, {"emb", "blocks.0.fc", "blocks.1.fc", "small"}, set()),
        (("*",), 1025, {"blocks.0.fc", "blocks.1.fc"}, {"emb", "small"}),  # emb has 1024
        (("blocks.*",), 1024, {"blocks.0.fc", "blocks.1.fc"}, set()),
        (("blocks.1.*", "emb"), 1, {"emb", "blocks.1.fc"}, set()),
        (("blocks.?.fc",), 1, {"blocks.0.fc", "blocks.1.fc"}, set()),
        (("small",), 1024, set(), {"small"}),  # selected, but below min_size
    ],
)
def test_patterns_and_min_size_select_exactly(layers, min_size, expected, too_small):
    model = Toy()
    report = materialize(model, TensorizeOptions(max_rank=3, layers=layers, min_size=min_size))
    assert tt_names(model) == expected == set(report.tensorized)
    all_slots = {"emb", "blocks.0.fc", "blocks.1.fc", "small"}
    assert {s.name for s in report.skipped} == all_slots - expected
    assert not any(isinstance(m, Slot) for m in model.modules())
    assert tensorize_report(model) is report
    for s in report.skipped:  # the kind and the rule that applied
        assert s.kind == ("embedding" if s.name == "emb" else "linear")
        assert ("min_size" in s.reason) == (s.name in too_small), (s.name, s.reason)
        assert ("not selected" in s.reason) == (s.name not in too_small), (s.name, s.reason)
    # dense fallbacks have the slot's exact shape
    if isinstance(model.small, nn.Linear):
        assert model.small.weight.shape == (32, 16) and model.small.bias is None
    if isinstance(model.emb, nn.Embedding):
        assert model.emb.weight.shape == (64, 16)
    assert model.blocks[1]["fc"](torch.randn(2, 32)).shape == (2, 48)


def test_skip_reasons_name_the_rule():
    model = Toy()
    report = materialize(model, TensorizeOptions(max_rank=3, layers=("emb", "small")))
    reasons = {s.name: s.reason for s in report.skipped}
    assert "min_size=1024" in reasons["small"] and "512" in reasons["small"]
    assert "not selected" in reasons["blocks.0.fc"] and "layers" in reasons["blocks.0.fc"]
    assert json.loads(json.dumps(report.to_dict()))["tensorized"] == ["emb"]
    assert SkippedLayer("small", "linear", reasons["small"]) in report.skipped


def test_dense_materialize_reports_every_slot():
    model = Toy()
    report = materialize(model, TensorizeOptions(layers=("nothing",)), tensorized=False)
    assert report.tensorized == () and len(report.skipped) == 4
    assert all("dense model" in s.reason for s in report.skipped)
    assert tt_names(model) == set()


def test_options_reach_the_layers_and_specialize_overrides():
    model = Toy()
    seen = []

    def specialize(name, slot):
        seen.append((name, slot.role))
        if slot.kind == "linear" and slot.role == "tiny":
            return {"in_modes": (4, 4), "out_modes": (4, 8), "d": None}
        return {}

    opts = TensorizeOptions(max_rank=2, embedding_max_rank=6, gate_threshold=0.3, d=3, min_size=1)
    materialize(model, opts, specialize=specialize)
    assert sorted(seen) == [
        ("blocks.0.fc", ""),
        ("blocks.1.fc", ""),
        ("emb", ""),
        ("small", "tiny"),
    ]
    assert model.small.in_modes == (4, 4) and model.small.out_modes == (4, 8)
    assert model.small.bias is None and model.small.gate_threshold == 0.3
    fc = model.blocks[0]["fc"]
    assert len(fc.in_modes) == 3 and max(fc.ranks) == 2 and fc.gate_threshold == 0.3
    assert len(model.emb.row_modes) == 3 and max(model.emb.ranks) == 6
    assert model.emb.gate_threshold == 0.3


def test_auto_rank_without_d_builds_two_core_linears_and_leaves_embeddings_alone():
    """``max_rank: "auto"`` with no ``d``: every TT linear is a rank-r product (one mode per
    side, two cores); an embedding keeps its cores; a given ``d``, explicit ``modes`` and a
    fixed rank all keep the factorization by size."""
    model = Toy()
    report = materialize(model, TensorizeOptions(max_rank="auto", min_size=1))
    for name in ("blocks.0.fc", "blocks.1.fc"):
        layer = model.get_submodule(name)
        assert (layer.in_modes, len(layer.cores)) == ((layer.in_features,), 2), name
    # 16 x 32 breaks even at rank 10.7 < MIN_BREAK_EVEN_RANK: it stays dense, and says why
    assert type(model.small) is nn.Linear
    assert "below rank 10.7" in {s.name: s.reason for s in report.skipped}["small"]
    assert len(model.emb.row_modes) >= 2
    assert TensorizeOptions(max_rank="auto").linear_order == 1
    assert TensorizeOptions(max_rank="auto", d=2).linear_order == 2
    assert TensorizeOptions(max_rank=8).linear_order is None
    assert TensorizeOptions(max_rank=8, linear_d=1, d=3).linear_order == 1  # built at the choice
    assert TensorizeOptions(max_rank="auto", shapes="paper").linear_order is None
    given = Toy()
    modes = {"blocks.0.fc": {"in": [4, 8], "out": [6, 8]}}
    materialize(given, TensorizeOptions(max_rank="auto", min_size=1, modes=modes))
    assert (given.blocks[0]["fc"].in_modes, given.blocks[0]["fc"].out_modes) == ((4, 8), (6, 8))
    assert len(given.blocks[1]["fc"].in_modes) == 1


def test_pattern_that_matches_nothing_is_an_error():
    with pytest.raises(ValueError, match=r"layers: pattern 'block\.\*'.*candidates"):
        materialize(Toy(), TensorizeOptions(layers=("emb", "block.*")))
    with pytest.raises(ValueError, match="pattern 'head'"):  # dense-only layers do not count
        materialize(Toy(), TensorizeOptions(layers=("head",)))


def test_build_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"cannot tensorize 'emb'.*d must be >= 2"):
        materialize(Toy(), TensorizeOptions(d=1, min_size=1))


def test_unbuilt_slot_raises():
    with pytest.raises(RuntimeError, match="materialize"):
        linear_slot(3, 4)(torch.randn(2, 3))
    assert tensorize_report(nn.Linear(2, 2)) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_rank", 0),
        ("embedding_max_rank", 0),
        ("d", True),
        ("linear_d", 0),
        ("linear_d", 7),
        ("min_size", 0),
        ("gate_threshold", 1.0),
        ("shapes", "mnli"),
        ("layers", "encoder.*"),
        ("layers", ("",)),
    ],
)
def test_options_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TensorizeOptions(**{field: value})


def test_options_round_trip():
    opts = TensorizeOptions(max_rank=7, layers=["a.*", "b"], min_size=10, shapes="paper")
    assert opts.layers == ("a.*", "b")
    assert TensorizeOptions.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts
    assert opts.embedding_rank == 7 and TensorizeOptions(embedding_max_rank=3).embedding_rank == 3
    with pytest.raises(ValueError, match="unknown field"):
        TensorizeOptions.from_dict({"rank": 3})
    assert TensorizeReport().to_dict() == {"tensorized": [], "skipped": []}


# -- explicit modes ----------------------------------------------------------------------------
def test_explicit_modes_override_the_automatic_factorization_and_round_trip():
    from engine.models.mlp import MLPConfig, build_mlp

    modes = {"hidden.0": {"in": [4, 4, 4], "out": [2, 4, 4]}}
    opts = TensorizeOptions(max_rank=4, min_size=16, modes=modes)
    assert TensorizeOptions.from_dict(opts.to_dict()) == opts
    model = build_mlp(
        MLPConfig(in_features=64, hidden=(32, 32), num_classes=3),
        tensorized=True,
        options=opts,
    )
    first = model.get_submodule("hidden.0")
    assert (first.in_modes, first.out_modes) == ((4, 4, 4), (2, 4, 4))
    auto = build_mlp(
        MLPConfig(in_features=64, hidden=(32, 32), num_classes=3),
        tensorized=True,
        options=TensorizeOptions(max_rank=4, min_size=16),
    )
    assert auto.get_submodule("hidden.0").in_modes != (4, 4, 4)  # the override did something
    x = torch.randn(5, 64)
    assert model(x).shape == (5, 3)


@pytest.mark.parametrize(
    "modes, message",
    [
        ({"hidden.0": {"in": [4, 4], "out": [2, 4, 4]}}, "same number"),
        ({"hidden.0": {"in": [4, 0], "out": [2, 4]}}, "integers >= 1"),
        ({"hidden.0": {"in": [4, 4]}}, "exactly the keys"),
    ],
)
def test_explicit_modes_are_validated(modes, message):
    with pytest.raises(ValueError, match=message):
        TensorizeOptions(modes=modes)


def test_explicit_modes_must_match_a_tensorized_layer_and_fit_it():
    from engine.models.mlp import MLPConfig, build_mlp

    cfg = MLPConfig(in_features=64, hidden=(32, 32), num_classes=3)
    with pytest.raises(ValueError, match="matches no tensorized layer"):
        build_mlp(
            cfg,
            tensorized=True,
            options=TensorizeOptions(
                min_size=16, modes={"nothing.*": {"in": [8, 8], "out": [4, 8]}}
            ),
        )
    with pytest.raises(
        ValueError, match="modes: .*cannot tensorize .hidden.0."
    ):  # 2 x 2 < 64 inputs
        build_mlp(
            cfg,
            tensorized=True,
            options=TensorizeOptions(
                min_size=16, modes={"hidden.0": {"in": [2, 2], "out": [4, 8]}}
            ),
        )


@pytest.mark.parametrize(
    ("n_in", "n_out", "two_cores"),
    [(13, 256, False), (16, 16, False), (16, 32, False), (30, 256, True), (64, 256, True)],
)
def test_two_core_layers_stay_dense_below_the_break_even_rank(n_in, n_out, two_cores):
    """A linear the engine would build of two cores is built only where its break-even rank
    (counted here by brute force: the smallest rank whose built layer holds at least the dense
    weight's entries) is at least MIN_BREAK_EVEN_RANK; modes or a d given keep it tensorized."""

    class One(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = linear_slot(n_in, n_out)

    even = next(
        r
        for r in range(1, min(n_in, n_out) + 1)
        if TTLinear(n_in, n_out, d=1, max_rank=r).tt_parameters() >= n_in * n_out
    )
    assert math.ceil(break_even_rank(n_in, n_out)) == even
    model = One()
    materialize(model, TensorizeOptions(max_rank="auto", min_size=1))
    assert isinstance(model.fc, TTLinear) is two_cores
    assert two_cores is (break_even_rank(n_in, n_out) >= MIN_BREAK_EVEN_RANK)
    given = One()  # a factorization given by hand is the user's choice
    modes = {"fc": {"in": [n_in], "out": [n_out]}}
    materialize(given, TensorizeOptions(max_rank="auto", min_size=1, modes=modes))
    assert isinstance(given.fc, TTLinear)
    for d in (1, 2):  # a d given is the user's choice too, two cores (d 1) included
        fixed = One()
        materialize(fixed, TensorizeOptions(max_rank=8, min_size=1, d=d))
        assert isinstance(fixed.fc, TTLinear) and len(fixed.fc.in_modes) == d
    built = One()  # as the calibrated model is built: linear_d holds the engine's choice
    materialize(built, TensorizeOptions(max_rank=8, min_size=1, linear_d=1))
    assert isinstance(built.fc, TTLinear) is two_cores
