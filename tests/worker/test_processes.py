"""Data-parallel attempts (``worker.processes``): the engine under ``torchrun`` in processes of
its own, followed by the pipeline (called directly here; through a real Celery worker in
``test_celery_processes.py``). 2 gloo processes of 1 thread each on the tiny MLP."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.data import DataError
from engine.train import ConfigError, JobConfig
from service.store.db.crud.job_actions import cancel_job
from service.store.db.crud.jobs import get_job
from service.store.db.session import session_scope
from tests.helpers.groups import LAUNCHES
from tests.helpers.specs import early_stage, engine_job, mlp_model, synthetic_data
from tests.worker import jobs
from worker import processes
from worker.pipeline import run_job
from worker.processes import Outcome, _Events, descendants, prepare

TWO = {"batch_size": 16, "log_every": 5, "devices": 2}
ENGINE_JOB = engine_job(
    model=mlp_model(32),
    data=synthetic_data(params={"shape": [8, 8], "num_classes": 4}),
    schedule=[early_stage(steps=2)],
    training={"batch_size": 16},
)
pytestmark = pytest.mark.filterwarnings(  # kombu's SQLAlchemy transport, not our code
    "ignore:The ``noload`` loader strategy is deprecated"
)


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # each process: 1 thread on the shared CPUs


def _outcome(tmp_path, text: str, code: int = 1) -> Outcome:
    log = tmp_path / "processes.log"
    log.write_text(text)
    return Outcome(code, None, False, log)


def test_a_failure_is_told_from_the_processes_log(tmp_path):
    err = _outcome(tmp_path, "x\nerror: invalid config: training.batch_size: too big\n").error()
    assert isinstance(err, ConfigError) and err.field == "training.batch_size"
    err = _outcome(tmp_path, "error: bad data: train.jsonl:7: expected an object\n").error()
    assert isinstance(err, DataError) and str(err) == "train.jsonl:7: expected an object"
    alloc = "RuntimeError: [enforce fail] DefaultCPUAllocator: can't allocate memory: 9 bytes"
    assert isinstance(_outcome(tmp_path, f"Traceback\n{alloc}\n").error(), MemoryError)
    err = _outcome(tmp_path, "OSError: [Errno 28] No space left on device\n").error()
    assert isinstance(err, OSError) and err.errno == 28
    err = _outcome(tmp_path, "Traceback\nValueError: boom\nchild failed\n", code=1).error()
    assert str(err) == "the training processes exited with status 1: ValueError: boom"


def test_events_are_read_by_complete_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    events = _Events(path)
    assert events.read() == []  # not there yet
    path.write_text('{"event": "step", "step": 1}\n{"event": "st')
    assert events.read() == [{"event": "step", "step": 1}]
    with open(path, "a") as f:
        f.write('ep", "step": 2}\n')
    assert events.read() == [{"event": "step", "step": 2}]


def test_descendants_include_grandchildren_in_sessions_of_their_own():
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
        " start_new_session=True)\n"
        "print('ok', flush=True)\ntime.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert parent.stdout.readline() == b"ok\n"
        [child] = descendants(parent.pid)
        assert descendants(os.getpid()).keys() >= {parent.pid, child}
    finally:
        for pid in descendants(parent.pid):
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


@LAUNCHES
def test_a_two_device_job_runs_in_processes_and_is_recorded_as_one(pg_url, tmp_path):
    settings, factory = jobs.settings_for(tmp_path, pg_url), jobs.factory_for(pg_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec(training=TWO))
    assert run_job(job_id=job_id, attempt=1, settings=settings, factory=factory) == "succeeded"
    job, [attempt] = jobs.get(factory, job_id)
    assert job.state == "SUCCEEDED" and attempt.exit_reason == "completed"
    assert job.progress["step"] == 35 and job.progress["fraction"] == 1.0
    series = jobs.metric_series(factory, job_id)
    assert max(series["loss"]) == 35 and series["val_loss"]
    assert jobs.rank_series(factory, job_id)
    [export] = [c for c in jobs.checkpoints(factory, job_id) if c.kind == "export"]
    assert export.path.endswith("attempt-1/export/model.safetensors")
    distributed = export.manifest["extra"]["execution"]["distributed"]
    assert distributed["world_size"] == 2 and distributed["backend"] == "gloo"
    assert distributed["ddp_rebuilds"] >= 2  # the first wrap and one after a shrink at least
    assert export.manifest["report"]["file_ratio"] > 1
    assert export.manifest["extra"]["job_id"] == job_id


def _preempt_at(root: Path, step: int, deadline: float) -> None:
    """SIGTERM to this process (the worker) once rank 0 has reported ``step`` (read from its
    events file, not from the store)."""
    events: _Events | None = None
    while time.monotonic() < deadline:
        if events is None:
            found = sorted(root.rglob("events.jsonl"))
            events = _Events(found[0]) if found else None
        if events is not None and any(e.get("step", 0) >= step for e in events.read()):
            os.kill(os.getpid(), signal.SIGTERM)  # the Preemption handler is installed
            return
        time.sleep(0.01)


@LAUNCHES
def test_sigterm_stops_the_processes_and_the_next_attempt_resumes(
    sqlite_url, tmp_path, monkeypatch
):
    """SIGTERM to the worker (a preemption): the stop file stops both ranks with a partial
    checkpoint, the job is requeued as attempt 2, which resumes from it in 2 new processes.
    Attempt 1's ranks hold at step 12 until the stop file appears (:mod:`tests.worker.held_rank`),
    so the stop arrives mid-run however slowly this machine runs the test's side thread."""
    launcher = processes.torchrun_command

    def held(args, nproc):
        command = launcher(args, nproc)
        at = len(command) - 1 - command[::-1].index("engine.train")
        return [*command[:at], "tests.worker.held_rank", *command[at + 1 :]]

    monkeypatch.setattr("worker.processes.torchrun_command", held)
    monkeypatch.setenv("COMERA_TEST_HOLD_AT_STEP", "12")
    path = [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))  # the ranks' import
    settings, factory = jobs.settings_for(tmp_path, sqlite_url), jobs.factory_for(sqlite_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec(training={**TWO, "log_every": 1}))
    deadline = time.monotonic() + 150
    outcome, _ = jobs.run_beside(
        lambda: _preempt_at(tmp_path, 12, deadline),
        job_id=job_id,
        settings=settings,
        factory=factory,
    )
    assert outcome == "preempted"
    job, (first, second) = jobs.get(factory, job_id)
    [partial] = [c for c in jobs.checkpoints(factory, job_id) if c.kind == "partial"]
    assert (job.state, job.attempt) == ("QUEUED", 2) and first.exit_reason == "preempted"
    assert partial.step == 12 and second.resume_from == partial.id
    attempt_dir = (settings.artifacts / partial.path).parent.parent
    assert json.loads((attempt_dir / "report.json").read_text())["status"] != "completed"

    monkeypatch.setattr("worker.processes.torchrun_command", launcher)  # no hold now
    assert run_job(job_id=job_id, attempt=2, settings=settings, factory=factory) == "succeeded"
    job, (_, second) = jobs.get(factory, job_id)
    assert job.state == "SUCCEEDED" and job.progress["step"] == 35
    assert second.resume_from == partial.id and second.exit_reason == "completed"
    loss = jobs.metric_series(factory, job_id)["loss"]
    assert min(loss) <= partial.step  # attempt 1's points kept


def _stand_in(monkeypatch, code: str) -> None:
    """The launcher replaced by ``python -c code`` (its failure modes, without torch)."""
    monkeypatch.setattr(
        "worker.processes.torchrun_command", lambda args, nproc: [sys.executable, "-c", code]
    )


@pytest.mark.parametrize(
    ("code", "kind", "detail"),
    [
        (
            "import sys; print('Traceback\\nRuntimeError: rank 1 lost its device', "
            "file=sys.stderr); sys.exit(1)",
            "error",
            "RuntimeError: the training processes exited with status 1: "
            "RuntimeError: rank 1 lost its device",
        ),
        (
            "import sys; print('error: invalid config: training.batch_size: too large', "
            "file=sys.stderr); sys.exit(2)",
            "validation",
            "training.batch_size: too large",
        ),
    ],
)
def test_processes_that_fail_fail_the_job_with_their_reason(
    sqlite_url, tmp_path, monkeypatch, code, kind, detail
):
    _stand_in(monkeypatch, code)
    settings, factory = jobs.settings_for(tmp_path, sqlite_url), jobs.factory_for(sqlite_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec(training=TWO))
    assert run_job(job_id=job_id, attempt=1, settings=settings, factory=factory) == "failed"
    job, [attempt] = jobs.get(factory, job_id)
    assert job.state == "FAILED" and attempt.exit_reason == kind
    assert job.error["detail"] == detail


@LAUNCHES
def test_processes_that_ignore_the_stop_are_killed_and_the_cancel_completes(
    sqlite_url, tmp_path, monkeypatch
):
    code = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "pathlib.Path(sys.argv[1]).write_text('started')\n"
        "time.sleep(120)\n"
    )
    marker = tmp_path / "started"
    monkeypatch.setattr(
        "worker.processes.torchrun_command",
        lambda args, nproc: [sys.executable, "-c", code, str(marker)],
    )
    settings = jobs.settings_for(
        tmp_path, sqlite_url, process_stop_grace_seconds=0.5, cancel_kill_after_seconds=0.5
    )
    factory = jobs.factory_for(sqlite_url)
    job_id = jobs.make_job(factory, jobs.tiny_spec(training=TWO))

    def cancel_when_started() -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with session_scope(factory) as s:
            cancel_job(
                session=s, job=get_job(session=s, job_id=job_id), mode="graceful", save_partial=True
            )

    outcome, seconds = jobs.run_beside(
        cancel_when_started, job_id=job_id, settings=settings, factory=factory
    )
    assert outcome == "cancelled" and seconds < 20  # not the stand-in's 120 s
    job, [attempt] = jobs.get(factory, job_id)
    assert job.state == "CANCELLED" and attempt.exit_reason == "cancelled"


def test_the_launcher_is_torchrun_on_one_machine_and_the_ray_driver_across_machines(tmp_path):
    """What a data-parallel attempt starts (the Ray path runs end to end in 77 s on 2 cores, too
    long for CI: the engine's tests/engine/train/test_ray.py covers the driver)."""
    base = JobConfig.from_dict(ENGINE_JOB)
    two = dataclasses.replace(base, training=dataclasses.replace(base.training, devices=2))
    launch = prepare(two, out=tmp_path / "a", resume=None, export_extra={"job_id": "job_1"})
    command = launch.command
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "2"
    # a store the system binds on a port of its choosing, under a fresh run id: no window in
    # which another job takes a chosen port, and no default run id to join another job by
    assert "--standalone" in command and "--rdzv-endpoint" not in command
    assert command[command.index("--events") + 1] == str(tmp_path / "a" / "events.jsonl")
    assert json.loads(command[command.index("--export-extra") + 1]) == {"job_id": "job_1"}
    assert JobConfig.from_dict(json.loads((tmp_path / "a" / "job.json").read_text())) == two

    nodes = dataclasses.replace(base, training=dataclasses.replace(base.training, nodes=2))
    ckpt = tmp_path / "step-1.safetensors"
    launch = prepare(nodes, out=tmp_path / "b", resume=ckpt, export_extra={})
    assert launch.command[1:3] == ["-m", "engine.train.ray_driver"]
    assert launch.command[launch.command.index("--resume") + 1] == str(ckpt)
