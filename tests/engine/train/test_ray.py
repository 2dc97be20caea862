"""Multi-node jobs through Ray Train: ``python -m engine.train`` with ``training.nodes: 2`` runs
its driver on a local Ray instance (CPU, 2 workers, gloo) and ends where one process on the
same global batch ends; without the extra, the job is refused naming ``training.nodes``."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.train import FunctionCallback, JobConfig, Trainer
from engine.train.checkpoint import read_checkpoint
from engine.train.config import ConfigError
from engine.train.ray_driver import STAGING, _materialize, _relay_class
from engine.train.ray_launch import settings
from tests.engine.train.test_distributed import JOB as DDP_JOB
from tests.engine.train.test_distributed import assert_close_states, losses, ranks_at_shrinks

ROOT = Path(__file__).resolve().parents[3]
RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(
    not RAY, reason="the ray extra is not installed: pip install -e '.[ray]' (CI: '.[dev]')"
)

JOB = copy.deepcopy(DDP_JOB)  # a tensorized MLP, early and late stages, a shrink every 5 steps
JOB["name"] = "ray-mlp"
JOB["schedule"][0]["steps"], JOB["schedule"][1]["steps"] = 15, 10
JOB["checkpoint"] = {"every_steps": 10, "keep": 10}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "engine.train", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# the suite's heaviest test: a local Ray instance and its two workers, 20-23 s alone on an idle
# 2-core host but 57-65 s beside two other test processes: it runs alone (scripts/test.sh)
@pytest.mark.solo
@needs_ray
def test_two_ray_workers_end_where_one_process_ends(tmp_path):
    """The real path: the CLI starts the driver, which starts a local Ray instance and runs
    TorchTrainer with 2 workers; rank 0 writes the outputs, the events reach the file and every
    periodic checkpoint is reported to the storage path."""
    config, out, events = tmp_path / "job.json", tmp_path / "out", tmp_path / "events.jsonl"
    config.write_text(json.dumps({**JOB, "training": {**JOB["training"], "nodes": 2}}))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "COMERA_RAY_ADDRESS")}
    env.pop("COMERA_RAY_STORAGE", None)
    t0 = time.perf_counter()
    proc = _cli("--config", str(config), "--out", str(out), "--events", str(events), env=env)
    one: list[dict] = []  # the one-process run, while the Ray job starts
    reference = Trainer(
        JobConfig.from_dict(JOB), workdir=tmp_path / "one", callbacks=[FunctionCallback(one.append)]
    ).run()
    stdout, stderr = proc.communicate(timeout=400)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, stderr[-4000:]
    print(f"ray job end to end: {seconds:.1f} s")

    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "completed" and json.loads(stdout)["status"] == "completed"
    dist = report["execution"]["distributed"]
    assert dist["world_size"] == 2 and dist["backend"] == "gloo"
    assert (out / "model" / "manifest.json").exists()

    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert len([e for e in lines if e["event"] == "stage_end"]) == 3  # rank 0's events only
    shrinks = ranks_at_shrinks(one)
    assert len({json.dumps(r) for _, r in shrinks}) >= 3  # the ranks changed several times
    assert ranks_at_shrinks(lines) == shrinks
    assert losses(lines) == pytest.approx(losses(one), rel=1e-5, abs=1e-6)
    tensors, meta = read_checkpoint(out / "checkpoints" / "final.safetensors")
    assert meta["world_size"] == 2
    final = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
    assert_close_states(final, reference.model.state_dict(), 1e-5)

    run = json.loads((out / "ray_run.json").read_text())
    assert run["storage_path"] == str(out.resolve() / "ray")
    stored = out / "ray" / run["name"]
    for step in ("step-00000010", "step-00000020"):  # Ray Train's copy of the engine's file
        ckpt = stored / step / "checkpoints" / f"{step}.safetensors"
        assert ckpt.read_bytes() == (out / "checkpoints" / f"{step}.safetensors").read_bytes()
    for name in ("report.json", "model/model.safetensors", "checkpoints/final.safetensors"):
        assert (stored / "final" / name).read_bytes() == (out / name).read_bytes(), name
    assert not (out / STAGING).exists()  # every staged checkpoint handed over, then removed


@needs_ray
def test_the_driver_copies_the_outputs_only_when_rank_0_wrote_them_elsewhere(tmp_path):
    from ray.train import Checkpoint

    stored = tmp_path / "stored"  # the last report's checkpoint, as Ray Train keeps it
    (stored / "model").mkdir(parents=True)
    (stored / "report.json").write_text('{"status": "completed"}')
    (stored / "model" / "model.safetensors").write_bytes(b"weights")
    (stored / ".metadata.json").write_text("{}")  # Ray's own files stay behind
    result = SimpleNamespace(checkpoint=Checkpoint.from_directory(str(stored)))
    elsewhere = tmp_path / "elsewhere"  # rank 0 ran on another machine
    elsewhere.mkdir()
    _materialize(result, elsewhere)
    assert (elsewhere / "model" / "model.safetensors").read_bytes() == b"weights"
    assert (elsewhere / "report.json").exists() and not (elsewhere / ".metadata.json").exists()
    here = tmp_path / "here"  # rank 0 wrote this directory: nothing is copied over it
    (here / "model").mkdir(parents=True)
    (here / "report.json").write_text('{"status": "completed"}')
    _materialize(result, here)
    assert not (here / "model" / "model.safetensors").exists()


def test_without_the_extra_more_than_one_node_is_refused_naming_training_nodes(tmp_path):
    """Ray blocked in the process: the engine's modules still import (ray is imported only
    inside functions) and the job exits 2 naming the field and the extra."""
    config = tmp_path / "job.json"
    config.write_text(json.dumps({**JOB, "training": {**JOB["training"], "nodes": 2}}))
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import engine.train.cli, engine.train.launch, engine.train.ray_launch\n"
        "import engine.train.ray_driver\n"
        "from engine.train.cli import main\n"
        f"sys.exit(main(['--config', {str(config)!r}, '--out', {str(tmp_path / 'o')!r}]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "training.nodes" in proc.stderr and "comera-service[ray]" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_settings_come_from_the_command_line_then_the_environment(tmp_path):
    env = {"COMERA_RAY_ADDRESS": "head.example:6379", "RAY_ADDRESS": "other:6379"}
    env |= {"COMERA_RAY_STORAGE": "s3://bucket/runs", "COMERA_RAY_MAX_FAILURES": "3"}
    s = settings(out=tmp_path, env=env)
    assert (s.address, s.storage, s.max_failures) == ("head.example:6379", "s3://bucket/runs", 3)
    s = settings(out=tmp_path, address="head:6379", storage="shared", max_failures=0, env=env)
    assert s.address == "head:6379" and s.max_failures == 0
    assert s.storage == str(Path("shared").resolve())  # the workers run in other directories
    assert settings(out=tmp_path, env={"RAY_ADDRESS": "auto"}).address == "auto"
    s = settings(out=tmp_path, env={})
    assert s.address is None and s.storage == str(tmp_path.resolve() / "ray")
    with pytest.raises(ConfigError, match="COMERA_RAY_MAX_FAILURES"):
        settings(out=tmp_path, env={"COMERA_RAY_MAX_FAILURES": "many"})


def test_the_relay_appends_events_and_sees_the_stop_file(tmp_path):
    """The actor on the driver's machine, as a plain object."""
    events, stop = tmp_path / "events.jsonl", tmp_path / "stop"
    relay = _relay_class()(str(events), str(stop))
    relay.emit({"event": "step", "step": 1})
    assert relay.emit(None) and not relay.stopped()
    stop.touch()
    assert relay.stopped()
    relay.close()
    assert [json.loads(line) for line in events.read_text().splitlines()] == [
        {"event": "step", "step": 1}
    ]
