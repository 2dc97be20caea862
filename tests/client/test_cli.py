"""The ``comera`` command end to end: submit, watch, download, report and list against a real
``comera up``; ``comera run`` in process; the console script itself."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from client.cli import app
from tests.client.conftest import spec
from tests.helpers.groups import CLIENT
from tests.helpers.specs import model_spec

pytestmark = [pytest.mark.slow, CLIENT]
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def comera(server, *args: str):
    # no --api-key: the client finds the key ``comera up`` left in $COMERA_HOME/api_key
    result = CliRunner().invoke(
        app, ["--url", server.url, *args], env={**ENV, "COMERA_HOME": str(server.home)}
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def test_submit_watch_download_report_list(server, tmp_path: Path):
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec(name="cli-mlp", labels={"suite": "cli"})))
    submitted = comera(server, "submit", str(spec_file))
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.strip()
    assert job_id.startswith("job_")

    watched = comera(server, "watch", job_id)
    assert watched.exit_code == 0, watched.output + server.tail()
    assert "SUCCEEDED" in watched.stdout and "step 70/70" in watched.stdout

    out = tmp_path / "model.safetensors"
    downloaded = comera(server, "download", job_id, "-o", str(out))
    assert downloaded.exit_code == 0, downloaded.output
    status = json.loads(comera(server, "status", job_id, "--json").stdout)
    assert status["state"] == "SUCCEEDED"
    report = json.loads(comera(server, "report", job_id, "--json").stdout)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == report_sha(server, job_id)
    assert out.stat().st_size == report["file_bytes"]

    table = comera(server, "report", job_id)
    assert table.exit_code == 0, table.output
    for layer in report["layers"]:
        assert layer["name"] in table.stdout
    assert f"x{report['model_ratio']:.2f}" in table.stdout

    listed = comera(server, "list", "--label", "suite:cli")
    assert listed.exit_code == 0 and job_id in listed.stdout and "SUCCEEDED" in listed.stdout
    assert job_id not in comera(server, "list", "--state", "FAILED").stdout


def report_sha(server, job_id: str) -> str:
    from client import ComeraClient

    with ComeraClient(server.url, api_key=server.key) as c:
        return c.export_checkpoint(job_id).sha256


def test_errors_exit_nonzero_with_the_problem(server, tmp_path: Path):
    missing = comera(server, "status", "job_01NOSUCHJOB000000000000000")
    assert missing.exit_code == 1 and "404" in missing.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(spec(schedule=[{"kind": "early", "steps": 0}])))
    refused = comera(server, "submit", str(bad))
    assert refused.exit_code == 1 and "/schedule/0/steps" in refused.output
    unreachable = CliRunner().invoke(app, ["--url", "http://127.0.0.1:9", "list"], env=ENV)
    assert unreachable.exit_code == 2 and "cannot reach" in unreachable.output


def test_validate_reads_yaml(server, tmp_path: Path):
    yaml = pytest.importorskip("yaml")
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec()))
    result = comera(server, "validate", str(spec_file))
    assert result.exit_code == 0, result.output
    assert "plan" in result.stdout and "steps 70" in result.stdout
    assert "chosen by the run" not in result.stdout
    only_target = spec(schedule=[{"kind": "early", "steps": 20, "target_ratio": 0.5}])
    only_target["compression"] = {
        k: v for k, v in only_target["compression"].items() if k != "max_rank"
    }
    spec_file.write_text(yaml.safe_dump(only_target))
    result = comera(server, "validate", str(spec_file))
    assert result.exit_code == 0, result.output
    assert "max_rank: auto, chosen by the run" in result.stdout
    assert "gamma: auto, chosen by the run" in result.stdout


def test_console_script_is_the_client(server):
    script = Path(sys.executable).with_name("comera")
    done = subprocess.run(
        [str(script), "--url", server.url, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "", "COMERA_API_KEY": server.key},
    )
    assert done.returncode == 0, done.stderr
    assert "state" in done.stdout  # the table header


def test_run_trains_one_spec_in_process(tmp_path: Path):
    small = spec(
        name="local-mlp",
        schedule=[
            {"kind": "early", "steps": 12, "gamma": 0.05, "lr": {"cores": 0.003, "gates": 0.01}},
            {"kind": "finetune", "steps": 4, "lr": {"cores": 0.001, "gates": 0.0}},
        ],
        checkpointing={"every_n_steps": 8},
        training={"batch_size": 16, "device": "cpu"},
        dataset={
            "source": "synthetic",
            "generator": "mlp",
            "n_train": 200,
            "n_valid": 50,
            "params": {"shape": [8, 8], "num_classes": 3},
        },
    )
    spec_file, out = tmp_path / "job.json", tmp_path / "out"
    spec_file.write_text(json.dumps(small))
    result = CliRunner().invoke(app, ["run", str(spec_file), "--out", str(out)], env=ENV)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "completed" and report["steps"] == 16
    assert (out / "model" / "model.safetensors").is_file()
    assert (out / "model" / "manifest.json").is_file()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**small, "schedule": []}))
    refused = CliRunner().invoke(app, ["run", str(bad), "--out", str(out)], env=ENV)
    assert refused.exit_code == 2 and "/schedule" in refused.output


@pytest.mark.parametrize(
    ("changes", "pointer", "field"),
    [
        ({"model": model_spec("mlp", {"hiddn": [8]})}, "/model/config/hiddn", "hiddn"),
        ({"compression": {"layers": ["nothing.*"]}}, "/compression/layers", "compression.layers"),
    ],
)
def test_run_names_the_spec_field_of_an_engine_error(tmp_path: Path, changes, pointer, field):
    """An engine error names the spec's field as the service's 422 would
    (``api_schemas.engine_spec.engine_pointer``), and the engine's own field after it."""
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec(name="refused", **changes)))
    args = ["run", str(spec_file), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args, env=ENV)
    assert result.exit_code == 2, result.output
    assert f"{pointer}: " in result.output and field in result.output


def test_run_refuses_malformed_data_with_file_and_reason(tmp_path: Path):
    import numpy as np

    root = tmp_path / "data"
    root.mkdir()
    np.savez(root / "train.npz", x=np.zeros((10, 8, 8), np.float32), y=np.zeros(9, np.int64))
    body = spec(name="bad-npz", dataset={"source": "path", "path": "train.npz", "format": "npz"})
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(body))
    args = ["run", str(spec_file), "--out", str(tmp_path / "out"), "--data-root", str(root)]
    result = CliRunner().invoke(app, args, env=ENV)
    assert result.exit_code == 2, result.output
    assert "bad data:" in result.output and "train.npz" in result.output
    assert "as many labels as rows" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_server_commands_are_delegated_to_service_cli(tmp_path: Path):
    home = tmp_path / "home"
    helped = CliRunner().invoke(app, ["up", "--help"], env=ENV)
    assert helped.exit_code == 0 and "--workers" in helped.output
    for command in ("migrate", "api", "worker", "reaper", "keys"):  # what the README names
        helped = CliRunner().invoke(app, [command, "--help"], env=ENV)
        assert helped.exit_code == 0, (command, helped.output)
        assert f"Usage: comera {command}" in helped.output
    env = {**ENV, "COMERA_HOME": str(home)}  # restored by the runner afterwards
    migrated = CliRunner().invoke(app, ["migrate", "--home", str(home)], env=env)
    assert migrated.exit_code == 0, migrated.output
    assert "database at head" in migrated.output and (home / "comera.db").is_file()


def test_run_resolves_an_hf_dir_under_the_data_root(tmp_path: Path):
    from tests.worker.test_hf_job import _data_root, hf_spec

    root = tmp_path / "data"
    _data_root(root)  # models/tiny (a small BERT directory) and text/{train,valid}.txt
    spec_file, out = tmp_path / "job.json", tmp_path / "out"
    spec_file.write_text(json.dumps(hf_spec()))
    args = ["run", str(spec_file), "--out", str(out), "--data-root", str(root)]
    result = CliRunner().invoke(app, args, env=ENV)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "completed" and report["steps"] == 8
    manifest = json.loads((out / "model" / "manifest.json").read_text())
    assert manifest["model_config"]["path"] is None  # the architecture, not the directory
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(hf_spec("models/absent")))
    refused = CliRunner().invoke(
        app, ["run", str(missing), "--out", str(out), "--data-root", str(root)], env=ENV
    )
    assert refused.exit_code == 2 and "/model/source/path" in refused.output
    assert "no model directory 'models/absent'" in refused.output
