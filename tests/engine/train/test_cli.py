"""``python -m engine.train``: a real process runs a job and writes every promised file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.export import load_compressed

ROOT = Path(__file__).resolve().parents[3]
JOB = {
    "name": "tiny-nli", "method": "comera",
    "model": {"arch": "transformer", "config": {"d_model": 32, "n_heads": 4, "d_ff": 64,
                                                "n_layers": 1, "max_len": 24}},
    "data": {"kind": "synthetic", "generator": "nli", "n_train": 96, "n_valid": 32,
             "max_len": 24, "vocab_size": 120},
    "compression": {"max_rank": 4, "shrink_every": 3},
    "schedule": [{"kind": "early", "epochs": 1, "gamma": 0.1, "lr": {"gates": 0.05}},
                 {"kind": "late", "steps": 4, "target_ratio": 0.6},
                 {"kind": "finetune", "steps": 2}],
    "training": {"batch_size": 16, "log_every": 2},
}


def _run(tmp_path: Path, job: dict) -> subprocess.CompletedProcess:
    cfg = tmp_path / "job.json"
    cfg.write_text(json.dumps(job))
    return subprocess.run(
        [sys.executable, "-m", "engine.train", "--config", str(cfg), "--out",
         str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_one_job_writes_metrics_ranks_checkpoint_and_report(tmp_path):
    proc = _run(tmp_path, JOB)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {e["event"] for e in events} == {"step", "eval", "stage_end"}
    ranks = [json.loads(line) for line in (out / "ranks.jsonl").read_text().splitlines()]
    assert ranks and all("layers" in r and "totals" in r for r in ranks)
    report = json.loads((out / "report.json").read_text())
    for key in ("method", "arch", "parameters", "compression", "ranks", "stages", "export",
                "checkpoint", "wall_seconds"):
        assert key in report, key
    assert [s["kind"] for s in report["stages"]] == ["early", "late", "finetune"]
    assert all("seconds" in s and "metrics" in s for s in report["stages"])
    weights = out / "model" / "model.safetensors"
    assert report["export"]["bytes"] == weights.stat().st_size
    assert report["checkpoint"]["bytes"] == Path(report["checkpoint"]["path"]).stat().st_size
    model, manifest = load_compressed(out / "model")
    assert manifest["arch"] == "transformer"
    ids = torch.randint(0, 100, (2, 10))
    assert model(ids).shape == (2, 3)


@pytest.mark.parametrize(("change", "field"), [
    ({"model": {"arch": "resnet"}}, "model.arch"),
    ({"method": "lte"}, "method"),
    ({"schedule": [{"kind": "warm", "steps": 1}]}, "schedule[0].kind"),
])
def test_bad_config_exits_2_naming_the_field(tmp_path, change, field):
    proc = _run(tmp_path, {**JOB, **change})
    assert proc.returncode == 2
    assert field in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_malformed_data_row_exits_2_naming_file_and_line(tmp_path):
    train = tmp_path / "train.jsonl"
    rows = [{"premise": f"sentence number {i}", "hypothesis": "a sentence",
             "label": "a" if i % 2 else "b"} for i in range(40)]  # fmt: skip
    lines = [json.dumps(r) for r in rows]
    lines[16] = '{"premise": "no hypothesis", "label": "a"}'
    train.write_text("\n".join(lines) + "\n")
    job = {**JOB, "data": {"kind": "jsonl", "train": str(train), "max_len": 24},
           "schedule": [{"kind": "early", "steps": 4}]}  # fmt: skip
    proc = _run(tmp_path, job)
    assert proc.returncode == 2, proc.stderr
    assert f"error: bad data: {train}:17:" in proc.stderr
    assert "Traceback" not in proc.stderr
