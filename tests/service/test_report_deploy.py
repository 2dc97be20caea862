"""The deployment table of an ``hf`` job: what the engine measures fits the wire schema, the
service reads it from the export's manifest, and ``comera report`` shows it."""

from __future__ import annotations

from rich.console import Console

from api_schemas import CompressionReport
from api_schemas.artifacts import DeployReport
from client.render import deploy_table, report_tables
from engine.train.cli import run_job
from engine.train.job import JobConfig
from service.reports import _deploy
from tests.client.test_render_distributed import REPORT
from tests.engine.train.test_hf_jobs import _job, _model


def test_the_engines_deploy_table_reaches_comera_report(tmp_path):
    job = JobConfig.from_dict(_job(tmp_path, _model(tmp_path, "llama", "causal_lm", "dir")))
    measured = run_job(job, tmp_path / "out")["hf_export"]["deploy"]
    deploy = _deploy({"report": {"deploy": measured}})
    assert deploy == DeployReport.model_validate(measured)
    assert deploy.exported.parameters < deploy.original.parameters
    assert _deploy({"report": {"deploy": None}}) is None
    report = CompressionReport.model_validate({**REPORT, "deploy": measured})
    assert deploy_table(CompressionReport.model_validate(REPORT)) is None
    console = Console(record=True, width=200)
    console.print(report_tables(report))
    text = console.export_text()
    assert f"deployment on cpu, {measured['seq_len']} tokens a sequence" in text
    params = next(line for line in text.splitlines() if "│ parameters " in line)
    assert f"{measured['exported']['parameters']:,}" in params
    assert f"{measured['original']['parameters']:,}" in params
    latency = next(line for line in text.splitlines() if "latency, batch 32" in line)
    assert f"{measured['exported']['throughput']['latency_ms']:.2f} ms" in latency
