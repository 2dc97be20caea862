"""An ``hf_bert`` job through the real pipeline: a small BERT directory under the worker's data
root, distilled and compressed, exported, and its fidelity checked against a recomputation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engine.data.sentences import collate_sentences, sentence_tokenizer
from engine.export import load_compressed
from engine.models.hf_bert import load_pretrained, mean_pool
from engine.models.hf_bert.config import read_architecture
from service.reports import compression_report
from service.store.db.models import Job
from service.store.db.session import session_scope
from tests.helpers.hf_dirs import write_bert_dir
from tests.helpers.specs import api_job, hf_dir, model_spec, path_dataset, stages
from tests.worker.jobs import checkpoints, factory_for, get, make_job, settings_for
from worker.pipeline import run_job

WORDS = (
    "the model keeps what its teacher knows while tensor train cores shrink and "
    "every held out sentence shows how faithful the small encoder stays"
).split()


def _sentences(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(5, 14, (1,), generator=g))
        idx = torch.randint(0, len(WORDS), (k,), generator=g).tolist()
        out.append(" ".join(WORDS[i] for i in idx).capitalize() + ".")
    return out


def hf_spec(path: str = "models/tiny") -> dict[str, Any]:
    return api_job(
        name="tiny-bert",
        model=model_spec(
            "hf_bert",
            {"calibration_sentences": 32},
            source=hf_dir(path),
            distill={"kind": "mse_hidden", "weight": 1.0},
        ),
        dataset=path_dataset("text/train.txt", "text", valid_path="text/valid.txt", max_len=24),
        compression={"max_rank": 6, "d": 2, "shrink_every": 2},
        schedule=stages(
            early={"steps": 4, "gamma": 0.05, "lr": {"cores": 3e-3, "gates": 0.05, "others": 1e-3}},
            late={"steps": 2, "target_ratio": 0.8},
            finetune={"steps": 2},
        ),
        training={"batch_size": 8, "seed": 1, "log_every": 2, "device": "cpu"},
    )


def _data_root(root: Path) -> list[str]:
    """``models/tiny`` and ``text/{train,valid}.txt`` under ``root``; the valid sentences."""
    write_bert_dir(root / "models" / "tiny")
    (root / "text").mkdir(parents=True, exist_ok=True)
    (root / "text" / "train.txt").write_text("\n".join(_sentences(48, 0)) + "\n")
    valid = _sentences(12, 1)
    (root / "text" / "valid.txt").write_text("\n".join(valid) + "\n\n")  # a blank line: skipped
    return valid


def _reference_cosines(export: Path, original: Path, sentences: list[str]) -> torch.Tensor:
    """Per sentence: the exported model's mean-pooled embedding against the original's, with
    the engine's loaders and tokenizer, one batch, no trainer."""
    student, _ = load_compressed(export)
    teacher = load_pretrained(original, read_architecture(original))
    tok, pad = sentence_tokenizer(original / "tokenizer.json", 24)
    b = collate_sentences(sentences, tok, pad, None)
    ids, mask, types = b["input_ids"], b["attention_mask"], b["token_type_ids"]  # (N, S) each
    with torch.no_grad():
        got = mean_pool(student(ids, mask, types), mask)  # (N, D)
        want = mean_pool(teacher(ids, mask, types), mask)  # (N, D)
    return F.cosine_similarity(got.double(), want.double(), dim=-1)  # (N,)


@pytest.mark.slow
def test_hf_bert_job_succeeds_and_reports_fidelity_measured_on_the_export(db_url, tmp_path):
    _fidelity_job(db_url, tmp_path, devices=1)


@pytest.mark.slow
def test_a_two_process_hf_bert_job_reports_the_same_fidelity(sqlite_url, tmp_path, monkeypatch):
    """Two processes (gloo, torchrun): rank 0 measures the export in the engine and the worker
    reads it from its report; the figure must be the same recomputation as in one process (the
    store plays no part in it: one store only)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # each process: 1 thread on the shared CPUs
    _fidelity_job(sqlite_url, tmp_path, devices=2)


def _fidelity_job(db_url: str, tmp_path: Path, devices: int) -> None:
    """The small hf_bert job in ``devices`` processes, to SUCCEEDED; its report's fidelity is
    the exported file's, recomputed here without the trainer."""
    settings, factory = settings_for(tmp_path, db_url), factory_for(db_url)
    valid = _data_root(Path(settings.data))
    spec = hf_spec()
    spec["training"]["devices"] = devices
    job_id = make_job(factory, spec)

    assert run_job(job_id=job_id, attempt=1, settings=settings, factory=factory) == "succeeded"

    job, [attempt] = get(factory, job_id)
    assert job.state == "SUCCEEDED" and attempt.exit_reason == "completed"
    original = (Path(settings.data) / "models" / "tiny").resolve()
    assert job.engine_config["model"]["config"]["path"] == str(original)
    [export] = [c for c in checkpoints(factory, job_id) if c.kind == "export"]
    report = export.manifest["report"]
    fidelity = report["fidelity"]
    assert fidelity["sentences"] == len(valid) == 12
    assert report["file_ratio"] > 1 and len(report["layers"]) == 12
    # the fidelity is what the saved file does: recomputed here from the export directory
    cos = _reference_cosines(settings.artifacts / Path(export.path).parent, original, valid)
    assert fidelity["mean"] == pytest.approx(float(cos.mean()), abs=1e-5)
    assert fidelity["min"] == pytest.approx(float(cos.min()), abs=1e-5)
    # ... and agrees with the engine's last validation of the in-memory model
    assert fidelity["mean"] == pytest.approx(export.metrics["val_cosine"], abs=1e-4)
    assert job.compression["fidelity_cosine"] == fidelity["mean"]
    distributed = export.manifest["extra"]["execution"].get("distributed") or {}
    assert distributed.get("world_size", 1) == devices
    # the API serves it next to the compression measured on the file
    with session_scope(factory) as s:
        served = compression_report(session=s, settings=settings, job=s.get(Job, job_id))
    assert served.fidelity is not None and served.fidelity.mean == fidelity["mean"]
    assert served.file_bytes == export.size_bytes and served.baseline is None


def test_the_worker_checks_the_model_dir_against_its_own_data_root(db_url, tmp_path):
    settings, factory = settings_for(tmp_path, db_url), factory_for(db_url)
    _data_root(Path(settings.data))
    outside = write_bert_dir(tmp_path / "elsewhere")  # a valid model, outside the data root
    (Path(settings.data) / "models" / "link").symlink_to(outside, target_is_directory=True)
    job_id = make_job(factory, hf_spec("models/link"))  # as if another root had accepted it

    assert run_job(job_id=job_id, attempt=1, settings=settings, factory=factory) == "failed"

    job, [attempt] = get(factory, job_id)
    assert job.state == "FAILED" and attempt.exit_reason == "validation"
    assert job.error["type"].endswith("/validation")
    assert [e["pointer"] for e in job.error["errors"]] == ["/model/source/path"]
    assert "outside the data root" in job.error["detail"]
    assert not any(c.kind == "export" for c in checkpoints(factory, job_id))
