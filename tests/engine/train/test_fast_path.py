"""The fast path (group merges, sibling products) equals the eager path: loss and every
gradient on a small transformer, in training mode, with shrunk ranks, and in the trainer."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

from engine.models.transformer import TransformerConfig, build_transformer
from engine.nn.premerge import PremergeSession
from engine.nn.tt_linear import TTLinear
from engine.rank import GateIndex, shrink_model_
from engine.train import Trainer
from engine.train.fast_path import FastPath, supports_fast_path
from tests.engine.train.test_trainer import make_job, train_steps


def _model(dtype=torch.float64, max_rank: int = 4, **cfg):
    base = {"max_len": 16, "dropout": 0.0, "attn_dropout": 0.0, **cfg}
    model = build_transformer(
        TransformerConfig.tiny(**base), tensorized=True, max_rank=max_rank, shapes="auto"
    ).to(dtype)
    with torch.no_grad():
        for mod in model.modules():
            for g in getattr(mod, "gates", []):
                g.uniform_(0.3, 1.5)
                g[0] = 0.001  # dead: exercises the threshold in both paths
    return model


def _batch(b: int = 3):
    return torch.randint(0, 100, (b, 16)), torch.randint(0, 3, (b,))


def _loss_and_grads(model, ids, labels, fast: FastPath | None):
    model.zero_grad(set_to_none=True)
    index = GateIndex(model)
    if fast is None:
        logits = model(ids)
    else:
        with fast.session():
            logits = model(ids)
    loss = F.cross_entropy(logits, labels) + 0.3 * index.penalty()
    loss.backward()
    return loss.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def _assert_same(a, b, tol: float) -> None:
    (la, ga), (lb, gb) = a, b
    assert torch.allclose(la, lb, rtol=tol, atol=0), (la, lb)
    assert ga.keys() == gb.keys()
    scale = max(float(g.abs().max()) for g in gb.values())
    for name in ga:
        err = float((ga[name] - gb[name]).abs().max())
        assert err <= tol * max(float(gb[name].abs().max()), 1e-3 * scale), (name, err)


def test_loss_and_every_gradient_equal_eager_float64_with_siblings():
    model = _model(n_heads=8, max_rank=8)  # rank 8 > head width 4: attention in full width
    ids, labels = _batch()
    eager = _loss_and_grads(model, ids, labels, None)
    fast = FastPath(model)
    for _ in range(2):  # the first session learns the q/k/v runs, the second fuses them
        _assert_same(_loss_and_grads(model, ids, labels, fast), eager, 1e-12)
    runs = sorted(len(r) for r in fast._siblings.values())
    assert fast.learned and runs == [2, 2, 3, 3]  # q -> (q, k, v), k -> (k, v) per block
    with fast.session() as session:
        model(ids).sum().backward()
    assert session.stats["sibling_runs"] == 2 and session.stats["ffn"] == 2
    assert session.stats["attention"] == 0
    assert [len(g) for g in session.groups] == [9, 2, 2]  # 8 attention + classifier, fc1s, fc2s


def test_attention_in_rank_space_equals_eager_float64():
    model = _model()  # rank 4 < head width 8: q, k, v, out never leave rank space
    ids, labels = _batch()
    ids[0, 11:] = 0
    mask = ids != 0  # padding: a sequence with masked keys
    fast = FastPath(model)

    def run(fast_path):
        model.zero_grad(set_to_none=True)
        with fast_path.session() if fast_path else contextlib.nullcontext() as session:
            logits = model(ids, None, mask)
            loss = F.cross_entropy(logits, labels) + 0.3 * GateIndex(model).penalty()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return (loss.detach(), grads), session

    eager, _ = run(None)
    got, session = run(fast)
    _assert_same(got, eager, 1e-12)
    assert session.stats["attention"] == 2 and session.stats["linear"] == 1  # classifier fc1
    assert not any(float(g.abs().max()) for n, g in got[1].items() if n.endswith("attn.k.bias"))


def test_ranks_padded_for_many_rows_still_equal_eager():
    model = _model(max_rank=13)  # middle bonds 13: padded to 16 from 256 rows on
    ids, labels = torch.randint(0, 100, (20, 16)), torch.randint(0, 3, (20,))  # 320 rows
    fast = FastPath(model)
    fast.probe(lambda: model(ids))
    _assert_same(
        _loss_and_grads(model, ids, labels, fast), _loss_and_grads(model, ids, labels, None), 1e-12
    )
    with fast.session() as session:
        model(ids)
    ranks = {e.left[0].shape[-1] for e in session.merged.values()}
    bonds = {m.cores[len(m.in_modes)].shape[0] for m in model.modules() if isinstance(m, TTLinear)}
    assert 13 in bonds and 16 in ranks and 13 not in ranks


def test_training_mode_with_dropout_draws_the_same_masks():
    model = _model(torch.float32, dropout=0.1, attn_dropout=0.1)
    model.train()
    ids, labels = _batch(4)
    fast = FastPath(model)
    fast.probe(lambda: model(ids))
    torch.manual_seed(7)
    eager = _loss_and_grads(model, ids, labels, None)
    torch.manual_seed(7)
    _assert_same(_loss_and_grads(model, ids, labels, fast), eager, 2e-5)


def test_recompute_tt_outputs_and_shrunk_ranks_still_equal_eager():
    model = _model(recompute_tt_outputs=True)
    model.train()
    with torch.no_grad():  # kill different entries per layer: groups split by rank
        for i, mod in enumerate(m for m in model.modules() if isinstance(m, TTLinear)):
            mod.gates[i % len(mod.gates)][1 : 1 + i % 2 + 1] = 0.0
    shrink_model_(model)
    ids, labels = _batch()
    fast = FastPath(model)
    fast.probe(lambda: model(ids))
    _assert_same(
        _loss_and_grads(model, ids, labels, fast), _loss_and_grads(model, ids, labels, None), 1e-12
    )


def test_a_wrong_sibling_guess_costs_time_not_correctness():
    model = _model()
    attn = model.encoder[0].attn
    x1, x2 = torch.randn(2, 5, 32, **{"dtype": torch.float64}), torch.randn(2, 5, 32).double()
    layers = [m for m in model.modules() if isinstance(m, TTLinear)]
    runs = {id(attn.q): (id(attn.q), id(attn.k), id(attn.v))}
    with PremergeSession(layers, runs) as session:
        got = [attn.q(x1), attn.k(x2), attn.v(x1)]  # k reads another input
    assert session.stats["sibling_runs"] == 1
    want = [attn.q(x1), attn.k(x2), attn.v(x1)]
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)


def test_no_fast_path_when_blocks_are_recomputed_in_backward():
    assert not supports_fast_path(_model(recompute=True))
    assert supports_fast_path(_model())
    assert not supports_fast_path(torch.nn.Linear(3, 3))
    fast = FastPath(_model(recompute=True))
    with fast.session() as session:
        assert session is None


@pytest.mark.parametrize("fast_path", [True, False])
def test_trainer_reports_how_it_ran(tmp_path, fast_path):
    job = make_job("comera", training={"batch_size": 8, "seed": 1, "fast_path": fast_path})
    trainer = Trainer(job, workdir=tmp_path)
    assert (trainer.execution.fast is not None) is fast_path
    assert trainer.execution.report()["fast_path"] is fast_path
    assert trainer.execution.report()["cuda_graph"]["used"] is False  # CPU: auto is eager


def test_trainer_steps_match_with_and_without_the_fast_path(tmp_path):
    schedule = [{"kind": "early", "steps": 5, "gamma": 1.0, "lr": {"gates": 0.3}}]
    results, objectives = {}, {}
    for fast_path in (True, False):
        job = make_job(
            "comera",
            schedule=copy.deepcopy(schedule),
            training={"batch_size": 8, "seed": 1, "fast_path": fast_path, "log_every": 1},
            compression={"max_rank": 4, "shrink_every": 0},
        )
        tokenizer_from = None if fast_path else tmp_path / "True"
        results[fast_path], steps = train_steps(job, tmp_path / str(fast_path), tokenizer_from)
        objectives[fast_path] = [e["objective"] for e in steps]
    # float32 rounding only (measured: parameters within 1e-6, objectives to 1e-7)
    assert objectives[True] == pytest.approx(objectives[False], rel=1e-6)
    a, b = (r.model.state_dict() for r in (results[True], results[False]))
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-5), k
    la = results[True].report["stages"][0]["metrics"]
    lb = results[False].report["stages"][0]["metrics"]
    assert la["loss"] == pytest.approx(lb["loss"], rel=1e-6)


def test_forget_learns_the_runs_of_layers_that_replaced_the_old():
    """A late stage's rewrite replaces the TT-linears: the sibling runs learned from the old
    layers (kept by their ids) fuse nothing any more; after ``forget`` the next session learns
    the new layers' runs and the one after fuses them, equal to eager."""
    model = _model(n_heads=8, max_rank=8)
    ids, labels = _batch()
    fast = FastPath(model)
    _loss_and_grads(model, ids, labels, fast)
    old = dict(fast._siblings)
    assert fast.learned and old
    for name, layer in [(n, m) for n, m in model.named_modules() if isinstance(m, TTLinear)]:
        parent, _, attr = name.rpartition(".")  # a new object, the same function (a rewrite)
        setattr(model.get_submodule(parent), attr, copy.deepcopy(layer))

    def fused() -> int:
        with fast.session() as session:
            model(ids).sum().backward()
        model.zero_grad(set_to_none=True)
        return session.stats["sibling_runs"]

    assert fused() == 0  # the old ids name no layer of the model now
    fast.forget()
    assert not fast.learned and fast._siblings == {}
    eager = _loss_and_grads(model, ids, labels, None)
    _assert_same(_loss_and_grads(model, ids, labels, fast), eager, 1e-12)  # learns
    assert fast.learned and set(fast._siblings).isdisjoint(old)
    assert sorted(len(r) for r in fast._siblings.values()) == [2, 2, 3, 3]
    assert fused() == 2  # q/k/v of both blocks, from the new layers
    _assert_same(_loss_and_grads(model, ids, labels, fast), eager, 1e-12)
