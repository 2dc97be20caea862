"""Sequential calibration (engine.models.hf_bert.calib) against float64 references."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.models.hf_bert import build_hf_bert
from engine.models.hf_bert.calib import (
    AffineStats,
    embed,
    encoder_layers,
    fit_sequential_,
    run_block,
    solve,
)
from engine.models.hf_bert.config import HFBertConfig
from engine.models.hf_bert.prepare import prepare_student_
from engine.models.registry import TensorizeOptions
from engine.nn.tt_linear import TTLinear
from tests.helpers.assertions import assert_close_rel
from tests.helpers.hf_bert import write_tiny_bert


def random_batches(n_batches: int = 4, size: int = 8, width: int = 12, seed: int = 0):
    """Random sentences (ids of the MiniLM vocabulary) of random lengths, right padded."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(1000, 30000, (size, width), generator=g)  # (B, S)
        lengths = torch.randint(3, width + 1, (size,), generator=g)  # (B,)
        mask = torch.arange(width)[None, :] < lengths[:, None]  # (B, S)
        out.append((ids * mask, mask.long(), None))
    return out


def reduced_rank_reference(x, y, rank):
    """The rank-``rank`` affine least-squares fit by the textbook route (float64): OLS on the
    centred rows, then projection of the fitted values on their top right singular vectors."""
    mx, my = x.mean(0), y.mean(0)
    b_ols = torch.linalg.lstsq(x - mx, y - my).solution  # (in, out)
    _, _, vh = torch.linalg.svd((x - mx) @ b_ols, full_matrices=False)
    at = b_ols @ vh[:rank].T @ vh[:rank]  # (in, out)
    return at, my - mx @ at


@pytest.mark.parametrize("rank", [1, 3, 6])
@pytest.mark.parametrize("shape", [(10, 6), (5, 9)])  # both branches of solve (in >= out, <)
def test_solve_is_the_reduced_rank_least_squares_fit(rank, shape):
    g = torch.Generator().manual_seed(rank)
    n_in, n_out = shape
    x = torch.randn(200, n_in, generator=g, dtype=torch.float64) + 3.0  # off-centre rows
    y = x @ torch.randn(n_in, n_out, generator=g, dtype=torch.float64)
    y = y + 0.3 * torch.randn(200, n_out, generator=g, dtype=torch.float64)
    stats = AffineStats()
    for xp, yp in zip(x.split(64), y.split(64), strict=True):
        stats.add(xp, yp)
    left, right, bias, sv = solve(stats.whitened(ridge=0.0), rank)
    want_at, want_b = reduced_rank_reference(x, y, min(rank, n_in, n_out))
    assert_close_rel(left @ right, want_at, 1e-8, "A^T")
    assert_close_rel(bias, want_b, 1e-8, "bias")
    assert torch.all(sv[:-1] >= sv[1:])


def test_weighted_rows_count_as_repeated_rows():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(50, 4, generator=g), torch.randn(50, 3, generator=g)  # float32 rows
    x2, y2 = torch.randn(30, 4, generator=g) + 1.0, torch.randn(30, 3, generator=g)
    weighted, repeated = AffineStats(), AffineStats()
    weighted.add(x, y)
    weighted.add(x2, y2, 2.0)
    weighted.add(x2, y2, 0.0)  # no rows at all
    repeated.add(x, y)
    repeated.add(torch.cat([x2, x2]), torch.cat([y2, y2]))
    a, b = weighted.whitened(), repeated.whitened()
    for got, want, what in zip(a, b, ("s", "m", "mean_x", "mean_y"), strict=True):
        assert_close_rel(got, want, 1e-6, what)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = write_tiny_bert(tmp_path_factory.mktemp("bert"))
    cfg = HFBertConfig(path=str(directory), init="sequential")
    model = build_hf_bert(cfg, tensorized=True, options=TensorizeOptions(max_rank=64, d=1))
    return model.double()


def hidden_error(model, batches) -> float:
    """Relative error of the student's last hidden states to the teacher's (attended tokens)."""
    num = den = 0.0
    with torch.no_grad():
        for ids, mask, _ in batches:
            got, want = model(ids, mask), model.teacher(ids, mask)  # (B, S, D) each
            keep = mask.bool()
            num += float(((got - want)[keep] ** 2).sum())
            den += float((want[keep] ** 2).sum())
    return (num / den) ** 0.5


def test_the_staged_layers_compute_transformers_bert_model(tiny):
    """block_stages (what the fit and the probes run) is BertModel's forward, float64."""
    teacher = tiny.teacher
    for ids, mask, _ in random_batches(n_batches=2, seed=3):
        types = (torch.arange(ids.shape[1]) >= 5).long().expand_as(ids).contiguous()
        keep = mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        with torch.no_grad():
            (h,) = embed(teacher, [(ids, mask, types)])  # (B, S, D)
            for block in encoder_layers(teacher):
                h = run_block(block, h, keep)
            want = teacher.bert(
                input_ids=ids, attention_mask=mask, token_type_ids=types
            ).last_hidden_state  # (B, S, D) transformers' own forward
        assert_close_rel(h[mask.bool()], want[mask.bool()], 1e-12, "attended tokens")


@pytest.mark.parametrize("residual, anchor", [(False, 0.0), (True, 0.0), (True, 0.25)])
def test_sequential_fit_at_full_rank_reproduces_the_teacher(tiny, residual, anchor):
    model = copy.deepcopy(tiny)
    names = [n for n, m in model.named_modules() if isinstance(m, TTLinear)]
    full = {
        n: min(model.get_submodule(n).in_features, model.get_submodule(n).out_features)
        for n in names
    }
    batches = random_batches(n_batches=8)
    rows = fit_sequential_(
        model, model.teacher, batches, full, ridge=1e-10, residual=residual, anchor=anchor
    )
    assert [r["name"] for r in rows] == names  # data-flow order, every layer once
    assert hidden_error(model, random_batches(seed=5)) < 1e-6  # held-out sentences too


@pytest.mark.parametrize("residual, anchor", [(False, 0.0), (True, 0.25)])
def test_sequential_fit_beats_tt_svd_at_the_same_ranks(tiny, residual, anchor):
    model = copy.deepcopy(tiny)
    ranks = {n: 4 for n, m in model.named_modules() if isinstance(m, TTLinear)}
    plain = copy.deepcopy(model)
    for name in ranks:  # the TT-SVD (weight error) truncation at rank 4, as a reference
        dense = plain.teacher.get_submodule(name)
        layer = TTLinear.from_linear(
            dense,
            max_rank=4,
            in_modes=plain.get_submodule(name).in_modes,
            out_modes=plain.get_submodule(name).out_modes,
        )
        parent, _, leaf = name.rpartition(".")
        setattr(plain.get_submodule(parent), leaf, layer.double())
    batches = random_batches(n_batches=16, seed=2)
    rows = fit_sequential_(
        model, model.teacher, batches, ranks, ridge=1e-6, residual=residual, anchor=anchor
    )
    assert all(r["rank"] == 4 and 0 < r["fit_error"] < 1 for r in rows)
    for name in ranks:  # the parameter count is the TT-SVD's: same modes, same rank
        assert model.get_submodule(name).ranks == plain.get_submodule(name).ranks
    held_out = random_batches(seed=7)
    assert hidden_error(model, held_out) < 0.9 * hidden_error(plain, held_out)


def test_prepare_probes_a_few_calibration_sentences_when_the_split_has_no_more(tmp_path):
    directory = write_tiny_bert(tmp_path / "bert")
    cfg = HFBertConfig(
        path=str(directory),
        init="sequential",
        rank_allocation="sensitivity",
        target_compression=3.0,
        calibration_sentences=32,
        probe_sentences=4,
    )
    model = build_hf_bert(cfg, tensorized=True, options=TensorizeOptions(max_rank=64, d=1))
    batches = [
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        for ids, mask, _ in random_batches(n_batches=4)
    ]  # 32 sentences: all calibrate
    info = prepare_student_(model, batches, device=torch.device("cpu"))
    assert info is not None and info["calibration_sentences"] == 32
    assert info["probes_from"] == "calibration" and info["probe_sentences"] == 4
    layers = [m for m in model.modules() if isinstance(m, TTLinear)]
    dense = sum(m.dense_parameters() for m in layers)
    assert sum(sum(c.numel() for c in m.cores) for m in layers) <= dense / 3.0


def test_a_covariance_that_does_not_factor_gets_a_larger_ridge():
    """Rounding can leave the covariance of few calibration rows indefinite beyond the
    ridge (64 MiniLM sentences did at 1e-6): the ridge grows 10x until it factors, and the
    factor is that of the covariance plus the ridge that worked; past 1e-1 it is an error."""
    stats = AffineStats(
        count=1.0,
        shift=torch.zeros(3, dtype=torch.float64),
        sum_x=torch.zeros(3, dtype=torch.float64),
        sum_y=torch.zeros(2, dtype=torch.float64),
        xx=torch.diag(torch.tensor([1.0, 1.0, -1e-3], dtype=torch.float64)),  # (in, in)
        xy=torch.ones(3, 2, dtype=torch.float64),  # (in, out)
    )
    w = stats.whitened(ridge=1e-6)
    mean = (2.0 - 1e-3) / 3  # ridge x mean diagonal > 1e-3 first at 1e-2
    want = stats.xx + 1e-2 * mean * torch.eye(3, dtype=torch.float64)
    assert torch.allclose(w.s.mT @ w.s, want, rtol=0, atol=1e-12)
    stats.xx = torch.diag(torch.tensor([1.0, -10.0], dtype=torch.float64))
    stats.shift, stats.sum_x = (
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.float64),
    )
    stats.xy = torch.ones(2, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="does not factor"):
        stats.whitened()
