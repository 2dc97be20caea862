"""bfloat16 autocast training on the CPU: it runs, weights stay float32, losses track fp32."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from engine.models.transformer import TransformerConfig, build_transformer
from engine.train import ConfigError, JobConfig
from engine.train.fast_path import FastPath
from engine.train.precision import autocast
from tests.engine.train.test_trainer import MODEL, make_job, train_steps


def _run(tmp_path, method: str, precision: str, tokenizer_from=None):
    schedule = [{"kind": "early", "steps": 4, "gamma": 1.0, "lr": {"cores": 1e-3}}]
    model = copy.deepcopy(MODEL)  # no dropout: bf16 masks come from another generator
    model["config"].update(dropout=0.0, attn_dropout=0.0)
    job = make_job(
        method,
        model=model,
        schedule=copy.deepcopy(schedule),
        training={"batch_size": 8, "seed": 1, "precision": precision, "log_every": 1},
    )
    workdir = tmp_path / f"{method}-{precision}"
    return *train_steps(job, workdir, tokenizer_from), workdir


@pytest.mark.parametrize("method", ["comera", "dense"])
def test_bf16_steps_run_keep_float32_weights_and_track_fp32(tmp_path, method):
    ref, ref_steps, workdir = _run(tmp_path, method, "fp32")
    got, got_steps, _ = _run(tmp_path, method, "bf16", tokenizer_from=workdir)
    assert got.status == "completed"
    assert {p.dtype for p in got.model.parameters()} == {torch.float32}
    assert got.report["execution"]["precision"] == "bf16"
    assert len(got_steps) == len(ref_steps) == 4
    for a, b in zip(got_steps, ref_steps, strict=True):  # bf16 has 8 mantissa bits
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-2)
    assert got_steps[0]["train_loss"] != ref_steps[0]["train_loss"]  # it did run in bf16


def test_bf16_forward_runs_the_products_in_bf16_with_float32_gradients():
    model = build_transformer(
        TransformerConfig.tiny(max_len=16), tensorized=True, max_rank=4, shapes="auto"
    )
    ids, labels = torch.randint(0, 100, (3, 16)), torch.randint(0, 3, (3,))
    fast = FastPath(model)
    with autocast(torch.device("cpu"), "bf16"), fast.session() as session:
        logits = model(ids)
    assert logits.dtype == torch.bfloat16
    assert session.stats["linear"] > 0 and session.stats["ffn"] == 2
    F.cross_entropy(logits.float(), labels).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_precision_config_is_validated():
    base = make_job().to_dict()
    for training, field in [
        ({"precision": "fp16"}, "training.precision"),
        ({"precision": "bf16", "fast_path": False}, "training.precision"),
        ({"fast_path": "yes"}, "training.fast_path"),
    ]:
        bad = {**base, "training": {**base["training"], **training}}
        with pytest.raises(ConfigError) as err:
            JobConfig.from_dict(bad)
        assert err.value.field == field
    with pytest.raises(ValueError, match="precision"):
        autocast(torch.device("cpu"), "fp8")
