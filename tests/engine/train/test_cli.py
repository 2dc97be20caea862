"""``python -m engine.train``: a real process runs a job and writes every promised file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from engine.export import load_compressed
from tests.helpers.groups import LAUNCHES
from tests.helpers.services import train_cli
from tests.helpers.specs import engine_job, stages, synthetic_data, transformer_model

JOB = engine_job(
    name="tiny-nli",
    method="comera",
    model=transformer_model(),
    data=synthetic_data("nli", n_train=96, n_valid=32, max_len=24, vocab_size=120),
    compression={"max_rank": 4, "shrink_every": 3},
    schedule=stages(
        early={"epochs": 1, "gamma": 0.1, "lr": {"gates": 0.05}},
        late={"steps": 4, "target_ratio": 0.6},
        finetune={"steps": 2},
    ),
    training={"batch_size": 16, "log_every": 2},
)


def _run(tmp_path: Path, job: dict, *args: str) -> subprocess.CompletedProcess:
    """``python -m engine.train --config job.json --out out *args`` in ``tmp_path``."""
    return train_cli(tmp_path, job, tmp_path / "out", *args, timeout=300)


def test_one_job_writes_metrics_ranks_checkpoint_and_report(tmp_path):
    proc = _run(tmp_path, JOB)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {e["event"] for e in events} == {"step", "eval", "stage_end"}
    ranks = [json.loads(line) for line in (out / "ranks.jsonl").read_text().splitlines()]
    assert ranks and all("layers" in r and "totals" in r for r in ranks)
    report = json.loads((out / "report.json").read_text())
    for key in (
        "method",
        "arch",
        "parameters",
        "compression",
        "ranks",
        "stages",
        "export",
        "checkpoint",
        "wall_seconds",
    ):
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


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": {"arch": "resnet"}}, "model.arch"),
        ({"method": "lte"}, "method"),
        ({"schedule": [{"kind": "warm", "steps": 1}]}, "schedule[0].kind"),
    ],
)
def test_bad_config_exits_2_naming_the_field(tmp_path, change, field):
    proc = _run(tmp_path, {**JOB, **change})
    assert proc.returncode == 2
    assert field in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_malformed_data_row_exits_2_naming_file_and_line(tmp_path):
    train = tmp_path / "train.jsonl"
    rows = [
        {
            "premise": f"sentence number {i}",
            "hypothesis": "a sentence",
            "label": "a" if i % 2 else "b",
        }
        for i in range(40)
    ]
    lines = [json.dumps(r) for r in rows]
    lines[16] = '{"premise": "no hypothesis", "label": "a"}'
    train.write_text("\n".join(lines) + "\n")
    job = {
        **JOB,
        "data": {"kind": "jsonl", "train": str(train), "max_len": 24},
        "schedule": [{"kind": "early", "steps": 4}],
    }
    proc = _run(tmp_path, job)
    assert proc.returncode == 2, proc.stderr
    assert f"error: bad data: {train}:17:" in proc.stderr
    assert "Traceback" not in proc.stderr


# torchrun and its two ranks: 9-10 s alone, 28-36 s beside two other test processes on 2
# cores; so it runs alone (scripts/test.sh)
@pytest.mark.solo
@LAUNCHES
def test_nproc_per_node_runs_the_job_under_torchrun_and_rank_0_writes(tmp_path):
    """Two processes under torchrun (a real subprocess, the rendezvous on a free port): the
    same outputs as one process, the report says how it ran, the events file follows it."""
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    extra = json.dumps({"job_id": "job_1"})
    proc = _run(
        tmp_path,
        JOB,
        *("--nproc-per-node", "2", "--events", str(events), "--no-progress"),
        *("--export-extra", extra),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["execution"]["distributed"]["world_size"] == 2
    assert report["status"] == "completed" and (out / "model" / "manifest.json").exists()
    extra = json.loads((out / "model" / "manifest.json").read_text())["extra"]
    assert extra["job_id"] == "job_1" and extra["execution"] == report["execution"]
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = {e["event"] for e in lines}
    assert {"stage_start", "step", "eval", "ranks", "checkpoint", "stage_end"} <= kinds
    assert len([e for e in lines if e["event"] == "stage_end"]) == 3  # rank 0's events only


@LAUNCHES
def test_a_stop_file_stops_every_process_with_a_partial_checkpoint(tmp_path):
    out, stop = tmp_path / "out", tmp_path / "stop"
    stop.touch()  # present from the start: the job stops before its first step
    proc = _run(tmp_path, JOB, "--nproc-per-node", "2", "--stop-file", str(stop), "--no-progress")
    assert proc.returncode != 0  # torchrun reports the ranks' status 3 as a failure
    assert list((out / "checkpoints").glob("step-*-partial.safetensors"))
    assert json.loads((out / "report.json").read_text())["status"] == "cancelled"


@pytest.mark.parametrize("extra", ["[1]", "{"])
def test_export_extra_must_be_a_json_object(tmp_path, extra):
    proc = _run(tmp_path, JOB, "--export-extra", extra)
    assert proc.returncode == 2 and "--export-extra" in proc.stderr


def test_a_batch_that_does_not_divide_among_the_processes_exits_2(tmp_path):
    proc = _run(tmp_path, {**JOB, "training": {"batch_size": 15}}, "--nproc-per-node", "2")
    assert proc.returncode == 2 and "training.batch_size" in proc.stderr
