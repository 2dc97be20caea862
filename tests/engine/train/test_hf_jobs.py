"""Tiny Hugging Face models of every family compressed by the ``hf`` workload, end to end:
from the directory and from the config, through the trainer, the compact checkpoint and the
``model/hf/`` export; the export loaded by transformers in a process without this project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.export import load_compressed
from engine.train.cli import run_job
from engine.train.job import JobConfig
from tests.helpers.groups import LAUNCHES
from tests.helpers.hf_models import TEXT, VOCAB, make_model_dir, tiny_config, write_tokenizer
from tests.helpers.specs import early_stage, engine_job, late_stage, model_spec, text_data

ROOT = Path(__file__).resolve().parents[3]
LOADER = Path(__file__).with_name("hf_clean_loader.py")
FAMILIES = [
    ("bert", "masked_lm"),
    ("roberta", "masked_lm"),
    ("distilbert", "masked_lm"),
    ("gpt2", "causal_lm"),
    ("llama", "causal_lm"),
]


def _job(tmp: Path, model: dict, data: dict | None = None, **extra) -> dict:
    text = tmp / "train.txt"
    text.write_text("\n".join(TEXT) + "\n")
    return engine_job(
        model=model_spec("hf", model),
        data=data or text_data(text, valid_every=4, max_len=32),
        compression={"max_rank": 4, "min_size": 256},
        schedule=[early_stage(steps=4), late_stage(steps=4, target_ratio=0.9)],
        training={"batch_size": 4, "seed": 0},
        **extra,
    )


def _model(tmp: Path, family: str, task: str, start: str) -> dict:
    if start == "dir":
        return {"task": task, "path": str(make_model_dir(tmp, family, task))}
    tokenizer = write_tokenizer(tmp / "tokenizer")
    return {"task": task, "hf_config": tiny_config(family), "tokenizer": str(tokenizer)}


@pytest.mark.parametrize("start", ["dir", "config"])
@pytest.mark.parametrize(("family", "task"), FAMILIES)
def test_every_family_compresses_from_the_directory_and_from_the_config(
    tmp_path, family, task, start
):
    job = JobConfig.from_dict(_job(tmp_path, _model(tmp_path, family, task, start)))
    report = run_job(job, tmp_path / "out")
    assert report["status"] == "completed"
    assert report["compression"]["tensorized_ratio"] > 2, report["compression"]
    metrics = report["stages"][-1]["metrics"]
    assert set(metrics) >= {"loss", "accuracy", "perplexity"}
    assert report["hf_export"]["hf"]["tt_layers"] == len(report["ranks"])
    deploy = report["hf_export"]["deploy"]
    exported, original = deploy["exported"], deploy["original"]
    assert original["kind"] == ("pretrained" if start == "dir" else "densified")
    assert exported["parameters"] < original["parameters"]
    # model/hf/ as transformers loads it scores what the trainer measured at the end
    assert exported["metrics"]["perplexity"] == pytest.approx(metrics["perplexity"], rel=1e-4)
    assert exported["throughput"]["batch"] == 32 and deploy["seq_len"] == 32
    assert start == "config" or exported["file_bytes"] < original["file_bytes"]
    model, manifest = load_compressed(tmp_path / "out" / "model")
    assert manifest["arch"] == "hf" and manifest["model_config"]["path"] is None
    assert model.teacher is None  # a checkpoint rebuilds the architecture, not the original
    exported = tmp_path / "out" / "model" / "hf"
    assert {"config.json", "model.safetensors", "modeling_comera_tt.py", "tokenizer.json"} <= {
        p.name for p in exported.iterdir()
    }


def _reference(model_dir: Path, seed: int) -> dict:
    model, _ = load_compressed(model_dir)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (2, 12), generator=g)  # (B, S)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 8:] = False
    with torch.no_grad():
        out = model(ids, mask)  # (B, S, V) or (B, C) or (B, S, D)
    return {"ids": ids.tolist(), "mask": mask.tolist(), "out": out.tolist()}


def _loaded_alone(tmp_path: Path, cases: list[tuple[Path, str, str]]) -> list[dict]:
    """Each ``(model dir, Auto class, "hf" | "dense")`` loaded in a process where importing
    this project fails; its outputs checked against ``load_compressed`` to 1e-5 and, for a
    causal LM, ``generate()`` run. Returns the loader's rows."""
    requests = []
    for i, (model_dir, auto, kind) in enumerate(cases):
        ref = _reference(model_dir, seed=i)
        requests.append({"dir": str(model_dir / kind), "auto": auto, **ref})
    (tmp_path / "requests.json").write_text(json.dumps(requests))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    load = subprocess.run(
        [sys.executable, "-I", str(LOADER), str(tmp_path / "requests.json")],
        cwd=tmp_path,  # not the repository: nothing of it on sys.path
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert load.returncode == 0, load.stderr[-3000:]
    results = json.loads(load.stdout.strip().splitlines()[-1])
    for req, res in zip(requests, results, strict=True):
        assert res["max_abs_diff"] < 1e-5, (req["dir"], res)
        if req["auto"] == "AutoModelForCausalLM":
            assert res["generated"] == 5
    return results


# a training process, then a clean interpreter importing transformers: 18-22 s alone, 22-31 s
# beside two other test processes on 2 cores; so it runs alone (scripts/test.sh)
@pytest.mark.solo
@LAUNCHES
def test_a_llama_export_from_the_cli_loads_with_transformers_alone(tmp_path):
    """``python -m engine.train`` on a LLaMA (grouped-query attention) directory: its
    ``model/hf/`` (remote code) and ``model/dense/`` (the standard class) load without this
    project, outputs equal to ``load_compressed``, and generate."""
    llama = tmp_path / "llama"
    llama.mkdir()
    spec = _job(llama, {**_model(llama, "llama", "causal_lm", "dir"), "export_dense": True})
    (llama / "job.json").write_text(json.dumps(spec))
    run = subprocess.run(
        [sys.executable, "-m", "engine.train", "--config", str(llama / "job.json")]
        + ["--out", str(llama / "out"), "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    model = llama / "out" / "model"
    cases = [(model, "AutoModelForCausalLM", "hf"), (model, "AutoModelForCausalLM", "dense")]
    results = _loaded_alone(tmp_path, cases)
    assert results[0]["class"] == "ComeraTTModel" and results[1]["class"] == "LlamaForCausalLM"


@LAUNCHES
def test_gpt2_and_bert_exports_load_with_transformers_alone(tmp_path):
    """GPT-2 (``Conv1D``, transposed) and BERT (masked LM) jobs: each ``model/hf/`` loads
    without this project, outputs equal to ``load_compressed``; GPT-2 generates."""
    cases = []
    for family, task, auto in (
        ("gpt2", "causal_lm", "AutoModelForCausalLM"),
        ("bert", "masked_lm", "AutoModelForMaskedLM"),
    ):
        root = tmp_path / family
        root.mkdir()
        run_job(JobConfig.from_dict(_job(root, _model(root, family, task, "dir"))), root / "out")
        cases.append((root / "out" / "model", auto, "hf"))
    results = _loaded_alone(tmp_path, cases)
    assert [r["class"] for r in results] == ["ComeraTTModel", "ComeraTTModel"]


def test_sequence_classification_from_jsonl(tmp_path):
    rows = [{"premise": s, "label": "long" if len(s) > 40 else "short"} for s in TEXT]
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = _job(
        tmp_path,
        _model(tmp_path, "gpt2", "sequence_classification", "dir"),
        {"kind": "jsonl", "train": str(data), "text_b": None, "valid_every": 4, "max_len": 32},
    )
    report = run_job(JobConfig.from_dict(spec), tmp_path / "out")
    assert report["status"] == "completed"
    assert 0.0 <= report["stages"][-1]["metrics"]["accuracy"] <= 1.0
    model, manifest = load_compressed(tmp_path / "out" / "model")
    assert manifest["model_config"]["num_labels"] == 2
    assert model.net.config.num_labels == 2


def test_sentence_embedding_distils_the_pretrained_encoder(tmp_path):
    spec = _job(tmp_path, _model(tmp_path, "bert", "sentence_embedding", "dir"))
    report = run_job(JobConfig.from_dict(spec), tmp_path / "out")
    cosine = report["stages"][-1]["metrics"]["cosine"]
    assert 0.5 < cosine <= 1.0 + 1e-6


def test_a_ttm_embedding_keeps_the_compact_checkpoint_and_says_why_there_is_no_hf_dir(tmp_path):
    model = {**_model(tmp_path, "llama", "causal_lm", "config"), "tensorize_embeddings": True}
    report = run_job(JobConfig.from_dict(_job(tmp_path, model)), tmp_path / "out")
    assert "TTM embedding" in report["hf_export"]["hf"]["skipped"]
    assert not (tmp_path / "out" / "model" / "hf").exists()
    loaded, _ = load_compressed(tmp_path / "out" / "model")
    assert type(loaded.net.get_input_embeddings()).__name__ == "TTMEmbedding"
