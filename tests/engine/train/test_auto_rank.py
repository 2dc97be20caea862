"""``max_rank: "auto"`` (:mod:`engine.train.auto_rank`): the rank rule against a brute-force
search, the job defaults that turn it on, the calibration run inside a job (report, resume),
and the early-stage advice to raise ``max_rank`` (:mod:`engine.train.report`)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from engine.configs import ConfigError
from engine.nn.tt_linear import TTLinear
from engine.train import FunctionCallback, JobConfig, Trainer, parts
from engine.train.auto_rank import AutoRank, choose_rank, tt_tensor
from engine.train.auto_start import warm_start_
from engine.train.report import RAISE_MAX_RANK, early_stage_advice
from engine.tt.decompose import matrix_to_tt, tt_to_full

LR = {"cores": 0.003, "gates": 0.01, "others": 0.001}


def _weight(out: int, inp: int, seed: int, decay: float) -> torch.Tensor:
    """A float64 ``(out, in)`` weight with a decaying spectrum (and a random one's tail)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(out, out, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(inp, inp, generator=g, dtype=torch.float64))[0]
    k = min(out, inp)
    s = torch.tensor([decay**i for i in range(k)], dtype=torch.float64)
    w = (u[:, :k] * s) @ v[:, :k].T
    return w + 0.01 * torch.randn(out, inp, generator=g, dtype=torch.float64)


def _brute_force(w: torch.Tensor, in_modes, out_modes, tol: float, cap: int) -> int:
    """Every rank from 1 up: the engine's TT-SVD of the weight (padded as the layer pads),
    rebuilt in float64, its relative error against the padded ``W^T``; the first within
    ``tol``, else the largest rank allowed."""
    n_pad, m_pad = math.prod(in_modes), math.prod(out_modes)
    target = torch.zeros(n_pad, m_pad, dtype=torch.float64)
    target[: w.shape[1], : w.shape[0]] = w.T
    sizes = [*in_modes, *out_modes]
    full = max(min(math.prod(sizes[: k + 1]), math.prod(sizes[k + 1 :])) for k in range(5))
    for r in range(1, min(full, cap) + 1):
        cores = matrix_to_tt(w, in_modes, out_modes, max_rank=r)
        approx = tt_to_full([c.to(torch.float64) for c in cores]).reshape(n_pad, m_pad)
        if torch.linalg.norm(target - approx) <= tol * torch.linalg.norm(target):
            return r
    return min(full, cap)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_rule_picks_the_brute_force_minimum(seed):
    """A padded 3+3-core layer (10 -> 22, modes (2, 2, 3) -> (2, 3, 4)), many tolerances and
    caps: the rule's rank is the smallest whose TT-SVD is within the tolerance, found by
    decomposing every rank."""
    in_modes, out_modes = (2, 2, 3), (2, 3, 4)
    w = _weight(22, 10, seed, decay=0.6 + 0.1 * seed)
    tensor = tt_tensor(w, in_modes, out_modes)
    assert tensor.shape == (2, 2, 3, 2, 3, 4) and tensor.dtype == torch.float64
    checked = 0
    for tol in (0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 0.95):
        for cap in (1, 3, 6, 64):
            choice = choose_rank(tensor, tol, cap)
            assert choice.rank == _brute_force(w, in_modes, out_modes, tol, cap), (tol, cap)
            assert choice.full == 12  # min(2*2*3, 2*3*4) at the middle bond
            assert choice.capped == (choice.error > tol)
            assert choice.capped or choice.error <= tol
            checked += 1
    assert checked == 40


def test_the_bounds_leave_few_decompositions():
    """The unfolding bounds bracket the answer: of 64 ranks, a few are decomposed."""
    w = _weight(64, 64, 5, decay=0.5)
    for tol in (0.05, 0.1, 0.2, 0.3):
        choice = choose_rank(tt_tensor(w, (8, 8), (8, 8)), tol, 64)
        assert 1 < choice.rank < 64 and not choice.capped
        assert choice.decomposed <= 3


def test_a_tolerance_the_cap_cannot_meet_is_reported_capped():
    w = _weight(32, 32, 7, decay=0.99)  # nearly flat spectrum
    choice = choose_rank(tt_tensor(w, (4, 8), (4, 8)), 0.05, 4)
    assert (choice.rank, choice.capped) == (4, True) and choice.error > 0.05
    assert choose_rank(torch.zeros(2, 3, 4), 0.1, 8).rank == 1


# -- job defaults ------------------------------------------------------------------------------


def _job(*stages: dict[str, Any], **compression: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "method": "comera",
        "model": {"arch": "mlp", "config": {"hidden": [64, 64], "dropout": 0.0}},
        "data": {
            "kind": "synthetic",
            "generator": "mlp",
            "n_train": 640,
            "n_valid": 256,
            "params": {"shape": [16], "num_classes": 4, "noise": 0.8},
        },
        "compression": {"d": 2, "shrink_every": 5, **compression},
        "schedule": list(stages),
        "training": {"batch_size": 32, "seed": 3, "log_every": 10},
    }


def test_a_target_ratio_alone_gets_auto_rank_and_auto_gamma():
    job = JobConfig.from_dict(_job({"kind": "early", "steps": 5, "target_ratio": 0.5}))
    assert job.compression.options.max_rank == "auto"
    assert job.schedule[0].gamma == "auto"
    assert job.to_dict()["compression"]["max_rank"] == "auto"  # what :validate shows
    # a late stage's target is a target too; its early stage keeps the fixed default
    job = JobConfig.from_dict(
        _job({"kind": "early", "steps": 5}, {"kind": "late", "steps": 5, "target_ratio": 0.5})
    )
    assert job.compression.options.max_rank == "auto"
    assert job.schedule[0].gamma == 0.01 and job.schedule[1].gamma == 0.01


def test_a_given_rank_or_gamma_or_no_target_keeps_the_fixed_defaults():
    target = {"kind": "early", "steps": 5, "target_ratio": 0.5}
    assert JobConfig.from_dict(_job(target, max_rank=8)).compression.options.max_rank == 8
    with_gamma = JobConfig.from_dict(_job({**target, "gamma": "auto"}))
    assert with_gamma.compression.options.max_rank == 30
    plain = JobConfig.from_dict(_job({"kind": "early", "steps": 5}))
    assert plain.compression.options.max_rank == 30 and plain.schedule[0].gamma == 0.01
    dense = JobConfig.from_dict({**_job({"kind": "early", "steps": 5}), "method": "dense"})
    assert dense.compression.options.max_rank == 30
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(_job({"kind": "early", "steps": 5}, max_rank="automatic"))
    assert err.value.field == "compression.max_rank"


def test_auto_is_refused_for_pretrained_workloads():
    cfg = _job({"kind": "early", "steps": 5}, max_rank="auto")
    cfg["model"] = {"arch": "hf_bert", "config": {"path": "/nowhere"}}
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(cfg)
    assert err.value.field == "compression.max_rank"


# -- inside a job ------------------------------------------------------------------------------


def _run(cfg: dict[str, Any], path, **kw):
    events: list[dict[str, Any]] = []
    trainer = Trainer(
        JobConfig.from_dict(cfg), workdir=path, callbacks=[FunctionCallback(events.append)], **kw
    )
    return trainer, trainer.run(), events


@pytest.fixture
def twins(monkeypatch) -> list[torch.nn.Module]:
    """The dense twins the calibration trained, in order (copies: the run's own is freed)."""
    out: list[torch.nn.Module] = []
    real = parts.calibrate

    def calibrate(*args: Any):
        auto, twin = real(*args)
        out.append(copy.deepcopy(twin))
        return auto, twin

    monkeypatch.setattr(parts, "calibrate", calibrate)
    return out


def test_the_job_starts_at_the_largest_layer_choice_and_reports_each(tmp_path, twins):
    cfg = _job({"kind": "early", "steps": 30, "target_ratio": 0.5, "lr": LR})
    trainer, result, _ = _run(cfg, tmp_path / "a")
    auto = result.report["auto_rank"]
    assert set(auto["layers"]) == {"hidden.0", "hidden.1"}
    assert auto["probe"]["steps"] == 30  # at most the first stage's steps
    start = result.report["stages"][0]
    assert start["size_start"] is not None
    # every layer starts at the largest layer's choice (capped by its bond bounds)
    choice = AutoRank.from_dict(auto)
    assert (
        auto["build_rank"] == choice.build_rank == max(c["rank"] for c in auto["layers"].values())
    )
    again = Trainer(JobConfig.from_dict(cfg), workdir=tmp_path / "b")
    for name in choice.layers:
        layer = again.model.get_submodule(name)
        assert isinstance(layer, TTLinear)
        sizes = layer.mode_sizes
        bounds = [
            min(math.prod(sizes[: k + 1]), math.prod(sizes[k + 1 :])) for k in range(len(sizes) - 1)
        ]
        assert list(layer.ranks[1:-1]) == [min(choice.build_rank, b) for b in bounds]
    # the start: a job given the chosen rank, set from the calibrated twin by warm_start_
    # (the calibration leaves the run's random draws alone, so where a bond is wider than
    # the decomposition the extra slices are the fixed job's draw)
    fixed = Trainer(
        JobConfig.from_dict(_job(*cfg["schedule"], max_rank=choice.build_rank)),
        workdir=tmp_path / "c",
    )
    start = warm_start_(fixed.model, twins[-1])
    a, b = again.model.state_dict(), fixed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert auto["probe"]["start"] == start and set(start["error"]) == set(choice.layers)
    assert "starting from the TT-SVD of the dense twin" in auto["rule"]
    # the same seed chooses the same ranks and start
    assert again.control.auto_rank == auto


def test_without_d_the_linears_have_two_cores_as_a_job_built_at_the_choice(tmp_path, twins):
    """No ``d``: every TT linear is a rank-r product (two cores), and the start equals,
    bitwise, a job given the chosen rank and ``linear_d`` 1 (what the run builds with) set
    from the calibrated twin; each layer within the rule's tolerance of the twin's weight."""
    cfg = _job({"kind": "early", "steps": 20, "target_ratio": 0.5, "lr": LR})
    del cfg["compression"]["d"]
    auto = Trainer(JobConfig.from_dict(cfg), workdir=tmp_path / "a")
    choice = auto.control.auto_rank
    for name in choice["layers"]:
        layer = auto.model.get_submodule(name)
        assert len(layer.cores) == 2 and layer.in_modes == (layer.in_features,)
        assert layer.ranks[1] == min(choice["build_rank"], layer.in_features, layer.out_features)
    fixed = _job(*cfg["schedule"], max_rank=choice["build_rank"], linear_d=1)
    del fixed["compression"]["d"]
    fixed = Trainer(JobConfig.from_dict(fixed), workdir=tmp_path / "b")
    warm_start_(fixed.model, twins[0])
    a, b = auto.model.state_dict(), fixed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    errors = choice["probe"]["start"]["error"]
    assert all(0.0 <= errors[n] <= choice["probe"]["tolerance"] + 1e-6 for n in choice["layers"])


@pytest.mark.parametrize("d", [2, None], ids=["d2", "two-cores"])
def test_resume_keeps_the_choice_and_is_bitwise(tmp_path, d):
    stages = (
        {"kind": "early", "steps": 20, "target_ratio": 0.5, "lr": LR},
        {"kind": "late", "steps": 10, "target_ratio": 0.5, "lr": LR},
    )
    cfg = {**_job(*stages), "checkpoint": {"every_steps": 5, "keep": 10}}
    if d is None:
        del cfg["compression"]["d"]
    _, full, _ = _run(cfg, tmp_path / "full")
    ckpts = tmp_path / "full" / "checkpoints"
    # the model is built at the cap and takes the checkpoint's shapes; no calibration runs
    early = Trainer(
        JobConfig.from_dict(cfg),
        workdir=tmp_path / "early",
        resume=ckpts / "step-00000010.safetensors",
    )
    assert early.control.auto_rank == full.report["auto_rank"]
    _, resumed, _ = _run(cfg, tmp_path / "resumed", resume=ckpts / "step-00000025.safetensors")
    assert resumed.report["auto_rank"] == full.report["auto_rank"]
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# -- advice -------------------------------------------------------------------------------------


def test_advice_for_saturated_ranks_and_for_a_gap_to_the_dense_twin():
    bounds = {"a": [4, 16, 4], "b": [16]}
    start = {"a": [4, 8, 4], "b": [8]}  # bonds a[1] and b[0] limited by max_rank 8
    kept = early_stage_advice(
        ranks_start=start,
        ranks_end={"a": [4, 8, 3], "b": [8]},
        bounds=bounds,
        metric="accuracy",
        value=0.9,
        dense=None,
        tolerance=1.0,
    )
    assert kept is not None and kept["code"] == RAISE_MAX_RANK and kept["saturated"]
    assert "raise max_rank" in kept["fix"] and not kept["below_dense"]
    cut = {"ranks_start": start, "ranks_end": {"a": [4, 7, 4], "b": [8]}, "bounds": bounds}
    args = {"metric": "accuracy", "tolerance": 1.0}
    assert early_stage_advice(**cut, **args, value=0.9, dense=None) is None
    assert early_stage_advice(**cut, **args, value=0.9, dense=0.905) is None  # 0.5 points
    gap = early_stage_advice(**cut, **args, value=0.9, dense=0.92)
    assert gap is not None and gap["below_dense"] and not gap["saturated"]
    assert gap["gap_points"] == pytest.approx(2.0)
    # a layer at its full TT rank everywhere gives max_rank nothing to raise
    full = {"a": [4, 16, 4]}
    assert (
        early_stage_advice(
            ranks_start=full,
            ranks_end=full,
            bounds={"a": [4, 16, 4]},
            value=0.9,
            dense=None,
            **args,
        )
        is None
    )


def test_the_advice_to_a_job_on_auto_rank_names_the_choice_not_auto():
    """A job whose ranks max_rank 'auto' chose is not told to set 'auto': at the choice's cap
    it is told to go above the cap explicitly or to cut less in the early stage."""
    args = {
        "ranks_start": {"a": [8]},
        "ranks_end": {"a": [5]},
        "bounds": {"a": [16]},
        "metric": "accuracy",
        "tolerance": 1.0,
        "value": 0.9,
        "dense": 0.93,
    }
    capped = {"build_rank": 8, "capped": ["a"], "probe": {"cap": 8}}
    at_cap = early_stage_advice(**args, auto_rank=capped)
    assert at_cap is not None and at_cap["below_dense"]
    assert "cap of 8" in at_cap["fix"] and "above 8" in at_cap["fix"]
    assert "set it to 'auto'" not in at_cap["fix"]
    free = early_stage_advice(
        **args, auto_rank={"build_rank": 6, "capped": [], "probe": {"cap": 8}}
    )
    assert free is not None and "chose 6" in free["fix"] and "cap" not in free["fix"]
    assert "set it to 'auto'" in early_stage_advice(**args)["fix"]


def test_an_early_stage_held_at_its_rank_cap_says_so(tmp_path):
    """gamma 0 prunes nothing: every bond stays at max_rank 2 -> report entry and event."""
    cfg = _job({"kind": "early", "steps": 10, "gamma": 0.0, "lr": LR}, max_rank=2)
    _, result, events = _run(cfg, tmp_path)
    advice = result.report["stages"][0]["advice"]
    assert advice["code"] == RAISE_MAX_RANK and advice["saturated"]
    assert result.report["advice"] == [advice]
    [event] = [e for e in events if e["event"] == "advice"]
    assert event["code"] == RAISE_MAX_RANK and event["fix"] == advice["fix"]


def test_an_early_stage_under_its_dense_twin_says_so(tmp_path):
    cfg = _job({"kind": "early", "steps": 10, "target_ratio": 0.5, "lr": LR}, max_rank=8)
    trainer = Trainer(JobConfig.from_dict(cfg), workdir=tmp_path)
    trainer.control.dense_reference = {"accuracy": 1.0}  # a twin no model can match
    result = trainer.run()
    advice = result.report["stages"][0]["advice"]
    assert advice["below_dense"] and advice["dense"] == 1.0
    assert advice["gap_points"] > 1.0
