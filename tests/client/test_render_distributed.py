"""``comera report`` says how a data-parallel job ran."""

from __future__ import annotations

from rich.console import Console

from api_schemas import CompressionReport
from client.render import distributed_line, report_tables

REPORT = {
    "job_id": "job_1",
    "checkpoint_id": "ckpt_1",
    "file_bytes": 1000,
    "dense_bytes": 4000,
    "file_ratio": 4.0,
    "params": 250,
    "params_dense": 1000,
    "layers": [],
    "metrics": {"val_loss": 0.5},
    "stages": [],
    "spec_hash": "abc",
}


def report_text(report: CompressionReport) -> str:
    console = Console(record=True, width=160)
    console.print(report_tables(report))
    return console.export_text()


def test_a_data_parallel_report_names_its_processes():
    distributed = {
        "world_size": 2,
        "backend": "gloo",
        "ddp_rebuilds": 3,
        "ddp_rebuild_seconds": 0.125,
        "gate_repairs": 0,
    }
    execution = {"fast_path": True, "precision": "fp32", "distributed": distributed}
    report = CompressionReport.model_validate({**REPORT, "execution": execution})
    assert distributed_line(report) == "2 processes (gloo), 3 DDP wrapper builds in 0.12 s"
    assert any(
        line.startswith("data parallel") and "2 processes (gloo)" in line
        for line in report_text(report).splitlines()
    )
    assert report.model_dump(mode="json")["execution"]["precision"] == "fp32"


def test_a_one_process_report_has_no_such_line():
    one = CompressionReport.model_validate({**REPORT, "execution": {"distributed": None}})
    assert distributed_line(one) is None and "data parallel" not in report_text(one)
    assert distributed_line(CompressionReport.model_validate(REPORT)) is None
