"""CUDA-graph training steps: CPU behaviour of the option, and on a GPU replay == eager.

GPU tests follow the recipe of docs/method.md#cuda-graphs: capture, then replay and compare
against eager steps from the same state; poison a static output and check the replay restores
it; gates updated in place by the replayed optimizer; capture again after a physical shrink.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from engine.models.transformer import TransformerConfig, build_transformer
from engine.rank import GateIndex, shrink_model_
from engine.train import ConfigError, JobConfig, Trainer
from engine.train.cuda_graphs import GraphedStep, graphs_supported, prepare_optimizer_
from engine.train.fast_path import FastPath
from tests.engine.train.test_trainer import MODEL, make_job, train_steps

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# -- CPU: the option ---------------------------------------------------------------------
def test_on_with_a_cpu_device_is_a_config_error():
    base = make_job().to_dict()
    bad = {**base, "training": {**base["training"], "cuda_graph": "on"}}
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(bad)
    assert err.value.field == "training.cuda_graph" and "CUDA device" in str(err.value)
    bad["training"]["cuda_graph"] = "sometimes"
    with pytest.raises(ConfigError, match="cuda_graph"):
        JobConfig.from_dict(bad)


def test_auto_on_cpu_runs_eager(tmp_path):
    job = make_job("comera", training={"batch_size": 8, "seed": 1, "cuda_graph": "auto"})
    trainer = Trainer(job, workdir=tmp_path)
    assert trainer.execution.graphs is None
    assert trainer.execution.report()["cuda_graph"] == {
        "mode": "auto",
        "used": False,
        "captures": 0,
        "replays": 0,
        "failure": None,
    }
    assert isinstance(trainer.optimizer.param_groups[0]["lr"], float)  # untouched on CPU


def test_support_check_names_the_reason_and_off_has_no_runner():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    assert "CUDA device" in graphs_supported(torch.device("cpu"), opt)
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    if torch.cuda.is_available():
        assert "capturable" in graphs_supported(torch.device("cuda"), sgd)
    with pytest.raises(ValueError, match="off"):
        GraphedStep(opt, "off")


# -- GPU: capture and replay ----------------------------------------------------------------
def _optimizer(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    prepare_optimizer_(opt, torch.device("cuda"))
    return opt


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    cfg = TransformerConfig.tiny(max_len=16, dropout=0.0, attn_dropout=0.0)
    model = build_transformer(cfg, tensorized=True, max_rank=4, shapes="auto").cuda()
    return model, _optimizer(model)


def _step_fn(model, opt, fast):
    index = GateIndex(model)

    def step(batch):
        model.train()
        with fast.session():
            logits = model(batch["ids"])
        loss = F.cross_entropy(logits, batch["labels"]) + 0.5 * index.penalty()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return {"loss": loss.detach()}

    return step


def _batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [
        {
            "ids": torch.randint(0, 100, (4, 16), generator=g).cuda(),
            "labels": torch.randint(0, 3, (4,), generator=g).cuda(),
        }
        for _ in range(n)
    ]


@pytest.mark.gpu
@needs_cuda
def test_replayed_steps_equal_eager_steps_and_gate_updates_persist():
    model, opt = _setup()
    twin = copy.deepcopy(model)  # the same state, stepped eagerly
    graphed = GraphedStep(opt, "on")
    step = _step_fn(model, opt, FastPath(model))
    eager_step = _step_fn(twin, _optimizer(twin), FastPath(twin))
    gates0 = [g.detach().clone() for m in model.modules() for g in getattr(m, "gates", [])]
    for i, batch in enumerate(_batches(4)):
        out = graphed("early", batch, step)
        ref = eager_step(batch)
        assert graphed.captures == 1 and graphed.replays == i
        assert torch.allclose(out["loss"], ref["loss"], rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), (i, name)
    gates = [g.detach() for m in model.modules() for g in getattr(m, "gates", [])]
    assert any(not torch.equal(a, b) for a, b in zip(gates, gates0, strict=True))
    # poison the static output: a replay restores it
    out["loss"].fill_(float("nan"))
    again = graphed("early", _batches(1)[0], step)
    assert torch.isfinite(again["loss"]).all()


@pytest.mark.gpu
@needs_cuda
def test_capture_again_after_a_shrink_and_eager_for_odd_shapes():
    model, opt = _setup()
    graphed = GraphedStep(opt, "on")
    step = _step_fn(model, opt, FastPath(model))
    batches = _batches(3)
    graphed("early", batches[0], step)
    graphed("early", batches[1], step)
    with torch.no_grad():
        model.encoder[0].attn.q.gates[0][:2] = 0.0
    assert shrink_model_(model, opt).changed
    graphed.invalidate()
    step = _step_fn(model, opt, FastPath(model))  # the penalty index follows the new shapes
    graphed("early", batches[2], step)
    assert graphed.captures == 2
    odd = {"ids": batches[0]["ids"][:3], "labels": batches[0]["labels"][:3]}
    graphed("early", odd, step)  # a short batch: eager, the graph stays
    assert graphed.captured and graphed.captures == 2


@pytest.mark.gpu
@needs_cuda
def test_trainer_with_graphs_tracks_eager_across_stages_and_shrinks(tmp_path):
    model = copy.deepcopy(MODEL)
    model["config"].update(dropout=0.0, attn_dropout=0.0)
    schedule = [
        {"kind": "early", "steps": 6, "gamma": 1.0, "lr": {"gates": 0.3}},
        {"kind": "finetune", "steps": 3},
    ]
    runs, objectives = {}, {}
    for mode in ("on", "off"):
        job = make_job(
            "comera",
            model=copy.deepcopy(model),
            schedule=copy.deepcopy(schedule),
            training={
                "batch_size": 8,
                "seed": 1,
                "device": "cuda",
                "log_every": 1,
                "cuda_graph": mode,
            },
        )
        tokenizer_from = tmp_path / "on" if mode == "off" else None
        runs[mode], steps = train_steps(job, tmp_path / mode, tokenizer_from)
        objectives[mode] = [e["objective"] for e in steps]
    ex = runs["on"].report["execution"]["cuda_graph"]
    assert ex["used"] and ex["failure"] is None
    assert ex["captures"] >= 2 and ex["replays"] > 0  # one capture per stage at least
    assert objectives["on"] == pytest.approx(objectives["off"], rel=1e-4)
    a, b = runs["on"].model.state_dict(), runs["off"].model.state_dict()
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
