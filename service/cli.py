"""The server side of the ``comera`` command line: ``up`` (embedded mode), and the rest.

``comera up`` is the whole service on one machine with nothing to install: it applies the
migrations to a SQLite store under ``COMERA_HOME``, starts one local Celery worker process on
a SQLite-backed broker (kombu's SQLAlchemy transport) and serves the API with uvicorn. The
same processes, pointed at PostgreSQL and Redis through ``COMERA_DATABASE_URL`` and
``COMERA_BROKER_URL``, are the distributed deployment (``docker-compose.yml``).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from service.cli_settings import load_settings
from service.store.placement import queue_name
from service.store.settings import Settings

__all__ = ["app", "devices_present", "worker_command"]

app = typer.Typer(
    help="CoMERA compression service.", no_args_is_help=True, pretty_exceptions_enable=False
)

HomeOpt = Annotated[Path | None, typer.Option(help="state directory (COMERA_HOME)")]


def _env(settings: Settings) -> dict[str, str]:
    """The resolved settings as environment variables, for child processes."""
    env = dict(os.environ)
    env.update(
        COMERA_HOME=str(settings.home),
        COMERA_DATABASE_URL=settings.db_url,
        COMERA_BROKER_URL=settings.broker,
        COMERA_ARTIFACT_DIR=str(settings.artifacts),
        COMERA_DATA_ROOT=str(settings.data),
        COMERA_QUEUE=settings.queue,
    )
    return env


def worker_command(
    settings: Settings, *, hostname: str = "gpu0@%h", devices: int = 1, nodes: int = 1
) -> list[str]:
    """One worker: one job at a time, no prefetch, a fresh child per job
    (docs/service.md#celery-settings), on the
    queue of jobs placed on ``devices`` per node and ``nodes`` (``service.store.placement``)."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.celery_app",
        "worker",
        "--pool",
        "prefork",
        "--concurrency",
        "1",
        "--max-tasks-per-child",
        "1",
        "--queues",
        queue_name(settings.queue, devices=devices, nodes=nodes),
        "--hostname",
        hostname,
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]


@app.command()
def migrate(home: HomeOpt = None) -> None:
    """Apply the database migrations (run once before the API and workers start)."""
    from service.store.db.migrate import upgrade

    settings = load_settings(home)
    settings.ensure_dirs()
    upgrade(settings.db_url)
    typer.echo(f"database at head: {settings.db_url.split('@')[-1]}")


@app.command()
def up(
    home: HomeOpt = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: Annotated[int, typer.Option(min=0, max=16)] = 1,
) -> None:
    """Run the API and local worker processes with an embedded store and broker."""
    import uvicorn

    from service.main import create_app
    from service.store.db.migrate import upgrade
    from service.store.reaper import ReaperThread, TaskControl
    from service.task_control import CeleryControl, LocalControl

    _stacks_on_sigusr1()
    settings = load_settings(home)
    settings.ensure_dirs()
    upgrade(settings.db_url)
    _first_key(settings)
    procs: list[subprocess.Popen[bytes]] = []
    reaper: ReaperThread | None = None
    previous = signal.signal(signal.SIGTERM, _terminated)  # SIGTERM: out through finally
    try:
        procs.extend(
            subprocess.Popen(
                worker_command(settings, hostname=f"gpu{i}@%h"),
                env=_env(settings),
                start_new_session=True,
            )
            for i in range(workers)
        )
        typer.echo(
            f"comera up: store {settings.db_url}, broker {settings.broker}, "
            f"{workers} worker(s), API on http://{host}:{port}/v1",
            err=True,
        )
        # the reaper (lost workers and messages, forced cancels) as a thread of this process;
        # the SQLite broker has no broadcast, so forced cancellation signals our own workers'
        # children; on Redis it goes through Celery's broadcast, as in deployments
        local = not settings.broker.startswith(("redis://", "rediss://"))
        control: TaskControl = (
            LocalControl(lambda: [p.pid for p in procs]) if local else CeleryControl(settings)
        )
        reaper = ReaperThread(settings, control=control)
        reaper.start()
        uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup
        if reaper is not None:
            reaper.stop()
        _stop(procs)
        signal.signal(signal.SIGTERM, previous)


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` writes every thread's stack to stderr (the process goes on): what a
    stuck API or shutdown is waiting for. A Celery worker's main process does the same."""
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM to ``comera up``: uvicorn shuts the API down on it, then raises the signal again
    once it has put this handler back; the default action would kill the process before the
    workers are stopped (they run in their own sessions and would outlive it). Raising here
    unwinds ``up`` through its ``finally`` instead: exit status 143 (128 + SIGTERM)."""
    raise SystemExit(128 + signum)


def _first_key(settings: Settings) -> None:
    from service.keys_cli import KEY_FILE, ensure_first_key

    key = ensure_first_key(settings)
    if key is not None:  # printed this once; the file is for the local ``comera`` client
        typer.echo(
            f"comera up: first API key (admin, tenant 'default'), shown once and kept "
            f"in {settings.home / KEY_FILE}:\n  {key}",
            err=True,
        )


def _stop(procs: list[subprocess.Popen], grace: float = 60.0) -> None:
    """Warm shutdown, then SIGKILL to each worker's process group after ``grace``.

    SIGTERM goes to each worker's main process only, as ``docker stop`` and systemd send it:
    the main process forwards it to the pool child that runs a job (``worker.shutdown``: the
    job checkpoints and is requeued) and ends its idle pool children itself. Signalling the
    whole group as well killed idle children at whatever point they were (logged as an ERROR
    at every shutdown), for nothing the main process does not already do."""
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@app.command()
def api(
    home: HomeOpt = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: Annotated[int, typer.Option(min=1, max=64, help="server processes")] = 1,
    access_log: bool = True,
) -> None:
    """Serve only the API (deployments run workers separately)."""
    import uvicorn

    _stacks_on_sigusr1()
    settings = load_settings(home)
    if workers == 1:
        from service.main import create_app

        uvicorn.run(create_app(settings), host=host, port=port, access_log=access_log)
        return
    os.environ.update(_env(settings))  # each server process reads the same settings
    uvicorn.run(
        "service.main:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        access_log=access_log,
    )


@app.command()
def reaper(home: HomeOpt = None) -> None:
    """Run the reaper every COMERA_REAPER_INTERVAL_SECONDS until stopped: re-queue jobs whose
    worker was lost, re-send unsent and lost messages, force overdue cancellations
    (``service.store.reaper``; the celery beat task ``comera.reap`` does the same)."""
    import logging

    from service.store.reaper import ReaperThread
    from service.task_control import CeleryControl

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = load_settings(home)
    thread = ReaperThread(settings, control=CeleryControl(settings))
    signal.signal(signal.SIGTERM, lambda *_: thread.stop())
    typer.echo(f"comera reaper: every {thread.settings.reaper_interval_seconds:g} s", err=True)
    try:
        thread.run()  # in this thread, until SIGTERM or Ctrl-C
    except KeyboardInterrupt:
        pass


# run in a child: this package never imports torch, and the worker's main process, which
# forks the pool's children, must not have touched CUDA
_GPU_PROBE = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"


def devices_present(env: dict[str, str] | None = None) -> tuple[int, str]:
    """``(count, kind)``: the GPUs a worker started with ``env`` sees when CUDA is available
    (``CUDA_VISIBLE_DEVICES`` applies), else the CPU cores this process may run on."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _GPU_PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        gpus = int(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        gpus = 0  # no torch, or no driver: no GPU this worker could use
    if gpus > 0:
        return gpus, "CUDA GPU(s)"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1), "CPU core(s) (no CUDA GPU is available)"


@app.command()
def worker(
    home: HomeOpt = None,
    hostname: str | None = None,
    gpu: Annotated[int | None, typer.Option(min=0, help="pin to this GPU")] = None,
    devices: Annotated[
        int, typer.Option(min=1, max=64, help="run jobs of training.devices N (queue QUEUE.xN)")
    ] = 1,
    nodes: Annotated[
        int,
        typer.Option(min=1, max=256, help="drive Ray Train jobs of training.nodes M (QUEUE.nMxN)"),
    ] = 1,
) -> None:
    """Run one Celery worker: one job at a time, on one GPU (``--gpu i`` sets
    ``CUDA_VISIBLE_DEVICES=i`` and the node name ``gpu<i>@host``), or on the GPUs of its
    machine for jobs of ``training.devices`` N (``--devices N``: ``CUDA_VISIBLE_DEVICES`` as
    the operator set it, the node name ``gpus<N>@host``), or as the driver of Ray Train jobs
    across ``--nodes M`` machines (docs/distributed.md). Each consumes the queue of its
    placement (``service.store.placement``). ``--devices N`` above the devices present (the
    GPUs when CUDA is available, else the CPU cores: :func:`devices_present`) is refused."""
    settings = load_settings(home)
    if gpu is not None and (devices > 1 or nodes > 1):
        typer.echo("--gpu pins one GPU: use it without --devices and --nodes", err=True)
        raise typer.Exit(2)
    env = _env(settings)
    if devices > 1 and nodes == 1:  # a Ray driver's devices are on the cluster's nodes
        present, kind = devices_present(env)
        if devices > present:
            typer.echo(
                f"comera worker: --devices {devices} is more than the {present} {kind} of "
                f"this machine; a worker for training.devices N runs N processes, one per "
                f"device: start it with --devices {present} or fewer, or on a larger machine",
                err=True,
            )
            raise typer.Exit(2)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if nodes > 1:
        default = f"ray{nodes}x{devices}@%h"
    elif devices > 1:
        default = f"gpus{devices}@%h"
    else:
        default = f"gpu{0 if gpu is None else gpu}@%h"
    command = worker_command(settings, hostname=hostname or default, devices=devices, nodes=nodes)
    os.execve(sys.executable, command, env)


def _keys_app() -> typer.Typer:
    from service.keys_cli import app as keys

    return keys


app.add_typer(_keys_app(), name="keys")


if __name__ == "__main__":
    app()
