"""CoMERA jobs on a pretrained BERT: the trainer, the stages, resume, export and reload."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F

from engine.export import export_compressed, load_compressed
from engine.models.hf_bert import mean_pool
from engine.train import JobConfig
from engine.train.cli import run_job
from engine.train.trainer import Trainer
from tests.helpers.hf_bert import MINILM, write_tiny_bert

# The CI configuration of the acceptance run (figures in bench/results/minilm_fidelity.json):
# two cores per layer (d = 1), ranks spread over the 36 encoder linears by probed sensitivity
# within dense / 5 TT entries, each layer fitted sequentially (residual targets, teacher rows
# anchored) on all 4000 training sentences, then a short distillation on the pooled-embedding
# cosine, gates frozen (a late stage's pruning only costs fidelity here: the budget already
# fixes the ratio). Distillation from the fit (held-out cosine 0.854): 40 steps at cores lr
# 1e-4 reach 0.856, 100 steps 0.861; at 2e-4 (5 warm-up steps) 100 steps 0.863, 160 steps
# 0.867, 300 steps 0.874. A longer warm-up lets a higher rate pay: with 30 warm-up steps, 160
# steps at 5e-4 (this recipe) beat 2e-4 by ~0.0035 and 1e-3 by ~0.003 on 256 other held-out
# sentences; others' lr 1e-4 or trainable embeddings add <= 0.0015; adding a per-layer
# hidden-state MSE to the loss changes nothing (0.8745 vs 0.8737 after 300 steps). Random
# batches of these sentences are ~43% tokens; length buckets (8 batches a window) make a step
# ~2x cheaper, so this recipe runs 320 steps (0.879) in about the time 160 took (0.871). The
# allocation's depth gain (default 2: block i's sensitivity times 2**i) then lifts the fit
# from 0.852 to 0.871 and the end from 0.879 to 0.891 (examples/engine/README.md).
MINILM_JOB = {
    "version": 1, "name": "minilm-ci", "method": "comera",
    "model": {"arch": "hf_bert", "config": {
        "path": MINILM, "distill": "cosine_embedding", "init": "sequential",
        "calibration_sentences": 4000, "rank_allocation": "sensitivity", "target_ratio": 5.0,
        "probe_sentences": 32, "train_embeddings": False}},
    "data": {"kind": "synthetic", "generator": "stdlib_text", "n_train": 4000, "n_valid": 128,
             "max_len": 64, "length_buckets": 8},
    "compression": {"max_rank": 384, "d": 1, "shrink_every": 0},
    "schedule": [
        {"kind": "finetune", "steps": 320, "lr_schedule": "cosine", "warmup_steps": 30,
         "lr": {"cores": 5e-4, "gates": 0.0, "others": 2e-5}},
    ],
    "training": {"batch_size": 32, "seed": 0, "log_every": 10},
}  # fmt: skip


def embeddings(model, batches) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return torch.cat([mean_pool(model(b["input_ids"], b["attention_mask"],
                                          b["token_type_ids"]), b["attention_mask"])
                          for b in batches])  # fmt: skip


def export(result, trainer: Trainer, job: JobConfig, out) -> None:
    """What ``run_job`` exports (the CLI path), from a finished trainer."""
    export_compressed(result.model, out, arch=job.model.arch,
                      model_config=trainer.model_config.to_dict(),
                      options=job.compression.options.to_dict(), tensorized=True,
                      metrics=result.report["stages"][-1]["metrics"])  # fmt: skip


@pytest.mark.slow
def test_minilm_job_compresses_the_encoder_linears_5x_and_keeps_the_embeddings(tmp_path):
    t0 = time.perf_counter()
    job = JobConfig.from_dict(MINILM_JOB)
    trainer = Trainer(job, workdir=tmp_path)
    valid = list(trainer.data.valid.batches(0))
    teacher = trainer.model.teacher
    start = F.cosine_similarity(embeddings(trainer.model, valid), embeddings(teacher, valid))
    result = trainer.run()
    seconds = time.perf_counter() - t0
    report, stages = result.report, result.report["stages"]
    ratio = report["compression"]["tensorized_ratio"]
    cosine = stages[-1]["metrics"]["cosine"]
    print(
        f"\nminilm CI job: {seconds:.1f} s, encoder linears {ratio:.2f}x, whole encoder "
        f"{report['compression']['model_ratio']:.2f}x, held-out cosine: sequential fit "
        f"{float(start.mean()):.4f}, after each stage "
        f"{[round(s['metrics']['cosine'], 4) for s in stages]}"
    )  # noqa: T201
    assert trainer.model.preparation["calibration_sentences"] == 4000
    assert ratio >= 5.0
    # measured 0.871 after the fit, ~0.891 after 320 steps (~175 s on 2 cores); the
    # issue's 0.9 at 5x is not reached (bench/minilm_fidelity.py, examples/engine/README.md)
    assert cosine >= 0.88 and cosine >= float(start.mean()) + 0.01
    export(result, trainer, job, tmp_path / "model")
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    assert manifest["model_config"]["path"] is None
    assert manifest["model_config"]["architecture"]["num_hidden_layers"] == 6
    assert manifest["totals"]["tensorized_ratio"] == pytest.approx(ratio)
    loaded, _ = load_compressed(tmp_path / "model")
    assert loaded.teacher is None
    got, want = embeddings(loaded, valid), embeddings(result.model, valid)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    cos = F.cosine_similarity(got, embeddings(teacher, valid))
    assert float(cos.mean()) == pytest.approx(cosine, abs=1e-5)


def tiny_job(path: str, every: int | None = None) -> JobConfig:
    return JobConfig.from_dict({
        "name": "tiny", "model": {"arch": "hf_bert", "config": {"path": path}},
        "data": {"kind": "synthetic", "generator": "stdlib_text", "n_train": 32, "n_valid": 16,
                 "max_len": 24},  # 8 steps of 8: two passes, so the teacher table is used
        "compression": {"max_rank": 6, "d": 2, "shrink_every": 2},
        "schedule": [{"kind": "early", "steps": 4, "gamma": 0.05,
                      "lr": {"cores": 3e-3, "gates": 0.05, "others": 1e-3}},
                     {"kind": "late", "steps": 2, "target_ratio": 0.8},
                     {"kind": "finetune", "steps": 2}],
        "training": {"batch_size": 8, "seed": 1, "log_every": 2},
        "checkpoint": {"every_steps": every} if every else {},
    })  # fmt: skip


@pytest.mark.slow
def test_tiny_bert_job_resumes_exactly_and_exports(tmp_path):
    write_tiny_bert(tmp_path / "bert")
    job = tiny_job(str(tmp_path / "bert"), every=3)
    full = Trainer(job, workdir=tmp_path / "a").run()
    assert full.report["setup"]["teacher_embeddings"] == 32  # resumed runs rebuild it alike
    assert full.report["stages"][1]["size_end"] <= full.report["stages"][1]["size_ref"]
    resumed = Trainer(
        job,
        workdir=tmp_path / "b",
        resume=tmp_path / "a" / "checkpoints" / "step-00000006.safetensors",
    ).run()
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert full.report["stages"][-1]["metrics"] == resumed.report["stages"][-1]["metrics"]
    report = run_job(job, tmp_path / "c")
    loaded, manifest = load_compressed(tmp_path / "c" / "model")
    assert manifest["model_config"]["path"] is None
    assert manifest["totals"]["tensorized_layers"] == 12
    batches = list(Trainer(job, workdir=tmp_path / "d").data.valid.batches(0))
    reference = Trainer(
        job, workdir=tmp_path / "e", resume=tmp_path / "c" / "checkpoints" / "final.safetensors"
    ).model
    assert torch.allclose(embeddings(loaded, batches), embeddings(reference, batches),
                          rtol=1e-5, atol=1e-6)  # fmt: skip
    assert report["stages"][-1]["metrics"]["cosine"] > 0.5
