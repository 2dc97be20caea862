"""The Ray Train driver of a multi-node job, and the loop every worker runs.

``python -m engine.train.ray_driver`` takes the command line of ``python -m engine.train``
(:mod:`engine.train.cli`; it is started by :mod:`engine.train.ray_launch`) and:

1. connects to the Ray cluster (``ray.init(address=...)``), or starts a local instance;
2. runs ``TorchTrainer`` with ``ScalingConfig(num_workers=nodes x devices, use_gpu=<a CUDA
   job>)``, ``RunConfig(storage_path=<shared storage>, failure_config=FailureConfig(
   max_failures))`` and the engine's backend (``cpu:gloo,cuda:nccl``; gloo for a CPU job);
3. writes the outputs into ``--out`` on its own machine when rank 0 wrote them elsewhere (they
   travel in the last checkpoint reported), prints the CLI's summary and exits 0 (completed),
   3 (stopped), 2 (a bad config or data) or 1 (a failure Ray could not recover from).

Every worker runs :func:`train_loop`: the same :func:`engine.train.cli.run_job` as under
``torchrun``, inside the process group Ray Train set up (so
:func:`engine.train.distributed.current` sees it); rank 0 writes the outputs into ``--out`` on
its machine. At every periodic checkpoint all ranks call ``ray.train.report`` (a barrier); rank
0 hands over the engine's safetensors file (``checkpoints/step-N.safetensors``), which Ray
Train copies to the storage path. The last report carries the final (or partial) checkpoint
with ``report.json``, ``model/``, ``metrics.jsonl`` and ``ranks.jsonl``. After a failure Ray
Train restarts the workers (``max_failures``) and :func:`train_loop` resumes from the latest
reported checkpoint; ``--resume auto`` continues the Ray run recorded in ``OUT/ray_run.json``.

``--events FILE`` and ``--stop-file FILE`` are paths on the driver's machine: a small actor
placed there (:func:`_relay_class`) appends rank 0's events to the file and tells rank 0, at
most every :data:`STOP_POLL_SECONDS`, whether the stop file exists; the stop reaches every
rank at the same step as under ``torchrun``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from engine.data.errors import DataError
from engine.train import cli, distributed, ray_launch
from engine.train.callbacks import FunctionCallback
from engine.train.config import ConfigError
from engine.train.job import JobConfig
from engine.train.trainer import Trainer

__all__ = ["JobError", "RayTrainer", "main", "train_loop"]

STOP_POLL_SECONDS = 1.0
STAGING = ".ray-staging"  # under OUT: what rank 0 hands to ray.train.report
RUN_RECORD = "ray_run.json"  # under OUT: the Ray run's name and storage (for --resume auto)
OUTPUTS = ("report.json", "model", "metrics.jsonl", "ranks.jsonl", "tokenizer.json")
LOCAL_OBJECT_STORE_BYTES = 96 * 2**20  # a local instance: nothing large goes through it
LOCAL_ENV = {  # a local instance's defaults (a variable already set wins); a cluster keeps Ray's
    # Ray Train's helpers that only cost start-up time on one machine: no node to preempt, no
    # metrics to scrape, nothing to phone home
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # the controller polls its workers every 0.5 s instead of 2 s: each phase (start, reports,
    # the end) waits for a poll (the engine's Ray test: fit() 17.8 s instead of 28.5 s)
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
}


class JobError(Exception):
    """A bad config or data seen by a worker: the driver exits with ``code`` (picklable, unlike
    :class:`ConfigError`, whose constructor takes two arguments)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code, self.message = code, message

    def __str__(self) -> str:
        return self.message


# -- the workers ------------------------------------------------------------------------------
def _report(metrics: dict[str, Any], out: Path, files: list[Path] | None, name: str) -> None:
    """``ray.train.report`` on every rank (a barrier); rank 0 passes ``files``, hard-linked
    into a staging directory laid out like ``out``, as the checkpoint."""
    import ray.train

    checkpoint = None
    if files is not None:
        stage = out / STAGING / name
        shutil.rmtree(stage, ignore_errors=True)
        for top in files:
            for src in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
                dst = stage / src.relative_to(out)
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(src, dst)
                except OSError:  # another file system
                    shutil.copy2(src, dst)
        checkpoint = ray.train.Checkpoint.from_directory(str(stage))
    ray.train.report(
        metrics,
        checkpoint=checkpoint,
        checkpoint_dir_name=name,
        delete_local_checkpoint_after_upload=checkpoint is not None,
    )


class RayTrainer(Trainer):
    """A trainer that reports every periodic checkpoint to Ray Train, on every rank."""

    def _checkpoint(self, *, partial: bool = False, final: bool = False) -> Path:
        path = super()._checkpoint(partial=partial, final=final)  # every rank; rank 0 writes
        if not (partial or final):  # those travel with the outputs in the last report
            main = self.dist is None or self.dist.main
            metrics = {"step": self.state.global_step, "final": False}
            _report(metrics, self.workdir, [path] if main else None, path.stem)
        return path


class _StopPoll:
    """``should_stop`` on rank 0: the relay asked at most every :data:`STOP_POLL_SECONDS`."""

    def __init__(self, relay: Any) -> None:
        self.relay, self.last, self.flag = relay, float("-inf"), False

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self.flag and now - self.last >= STOP_POLL_SECONDS:
            import ray

            self.last = now
            self.flag = bool(ray.get(self.relay.stopped.remote()))
        return self.flag


def _resume_path(
    ctx: distributed.DistContext, out: Path, resume: str | None, stack: contextlib.ExitStack
) -> str | None:
    """The checkpoint to start from: the latest one reported to this Ray run (a restart after
    a failure, or ``--resume auto``), else ``--resume`` as rank 0 resolves it."""
    import ray.train
    import torch.distributed as dist

    reported = ray.train.get_checkpoint()
    if reported is not None:  # on this node: downloaded from the storage when remote
        found = sorted(
            (Path(stack.enter_context(reported.as_directory())) / "checkpoints").glob(
                "*.safetensors"
            )
        )
        return str(found[-1]) if found else None
    if resume == "auto":  # rank 0's choice, so that no rank starts from another state
        latest = cli._latest_checkpoint(out) if ctx.main else None
        chosen = [str(latest) if latest is not None else None]
        dist.broadcast_object_list(chosen, src=0)
        return chosen[0]
    return resume


def train_loop(config: dict[str, Any]) -> None:
    """One worker of the job (``TorchTrainer``'s ``train_loop_per_worker``)."""
    import ray.train

    cwd = Path(config["cwd"])
    if cwd.is_dir():  # relative data paths as under torchrun, where it is the parent's
        os.chdir(cwd)
    job = JobConfig.from_dict(config["job"])
    if job.training.device.startswith("cuda"):  # the engine takes cuda:LOCAL_RANK
        from ray.train.torch import get_device

        os.environ["LOCAL_RANK"] = str(get_device().index)  # the GPU Ray gave this worker
    ctx = distributed.current()  # the process group Ray Train set up
    if ctx is None:
        raise JobError(1, "a Ray Train worker outside a process group of 2 or more")
    out, relay = Path(config["out"]), config["relay"]
    callbacks = [FunctionCallback(lambda e: relay.emit.remote(e))] if config["events"] else []
    stop = _StopPoll(relay) if config["stop_file"] and ctx.main else None
    with contextlib.ExitStack() as stack:
        try:
            report = cli.run_job(
                job,
                out,
                resume=_resume_path(ctx, out, config["resume"], stack),
                callbacks=callbacks,
                should_stop=stop,
                trainer_cls=RayTrainer,
                export_extra=config["export_extra"],
            )
        except ConfigError as err:
            raise JobError(2, f"invalid config: {err}") from None
        except DataError as err:
            raise JobError(2, f"bad data: {err}") from None
    if ctx.main and config["events"]:  # every event written before the run ends
        ray.get(relay.emit.remote(None))
    files = None
    if ctx.main:
        files = [p for p in (out / n for n in OUTPUTS) if p.exists()]
        files.append(Path(report["checkpoint"]["path"]))
    name = "final" if report["status"] == "completed" else f"step-{report['steps']:08d}-partial"
    metrics = {"status": report["status"], "steps": report["steps"], "final": True}
    metrics["world_size"] = ctx.world
    _report(metrics, out, files, name)
    if ctx.main:  # Ray Train removed every staged checkpoint after copying it
        shutil.rmtree(out / STAGING, ignore_errors=True)


# -- the driver -------------------------------------------------------------------------------
def _relay_class() -> type:
    """The relay actor's class, defined here so that it is sent by value: its process loads
    neither the engine nor torch."""

    class Relay:
        def __init__(self, events: str | None, stop_file: str | None) -> None:
            self.file = open(events, "a", encoding="utf-8") if events else None  # noqa: SIM115
            self.stop_file = stop_file

        def emit(self, event: dict | None) -> bool:  # None: a flush (calls run in order)
            if event is not None and self.file is not None:
                self.file.write(json.dumps(event, sort_keys=True) + "\n")
                self.file.flush()
            return True

        def stopped(self) -> bool:
            return self.stop_file is not None and os.path.exists(self.stop_file)

        def close(self) -> None:
            if self.file is not None:
                self.file.close()
                self.file = None

    return Relay


def _run_name(job: JobConfig, out: Path, storage: str, resume: str | None) -> str:
    """This run's name under the storage path: the recorded one for ``--resume auto``, else a
    new one (a fresh start, as under ``torchrun``, never picks up an older run's state)."""
    record = out / RUN_RECORD
    if resume == "auto" and record.exists():
        name = json.loads(record.read_text())["name"]
    else:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", job.name)[:40] or "job"
        name = f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    record.write_text(json.dumps({"name": name, "storage_path": storage}) + "\n")
    return name


def _init_ray(address: str | None, workers: int) -> None:
    import ray

    if address is not None:
        ray.init(address=address)
    else:  # one machine: logical CPUs for every worker, a small object store, no dashboard
        for var, value in LOCAL_ENV.items():
            os.environ.setdefault(var, value)
        ray.init(
            num_cpus=max(workers, os.cpu_count() or 1),
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            include_dashboard=False,
        )


def _check_resources(workers: int, cuda: bool) -> None:
    """Refuse a job the cluster cannot place now (Ray would wait for it forever)."""
    import ray

    kind = "GPU" if cuda else "CPU"
    have = int(ray.cluster_resources().get(kind, 0))
    if have < workers:
        raise ConfigError(
            "training.nodes",
            f"{workers} workers (nodes x devices) need {workers} {kind}s, one each; "
            f"the Ray cluster has {have}",
        )


def _failure_code(err: BaseException) -> tuple[int, str]:
    """The exit status and message of a failed fit (2 when a worker refused the job)."""
    for exc in getattr(err, "worker_failures", {}).values():
        cause = getattr(exc, "cause", exc)
        if isinstance(cause, JobError):
            return cause.code, f"error: {cause.message}"
    return 1, f"error: training failed: {err}"


def _materialize(result: Any, out: Path) -> None:
    """Copy the outputs of the last report into ``out`` unless rank 0 wrote them there."""
    if result.checkpoint is None:
        return
    with result.checkpoint.as_directory() as d:
        src = Path(d)
        mine, theirs = out / "report.json", src / "report.json"
        if mine.exists() and theirs.exists() and mine.read_bytes() == theirs.read_bytes():
            return  # rank 0 ran on this machine (or out is shared)
        shutil.copytree(src, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".*"))


def run(args: Any, job: JobConfig, nproc: int, nodes: int) -> int:
    """Run the job on ``nodes x nproc`` Ray Train workers; the exit status."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    out = Path(args.out).resolve()
    found = ray_launch.settings(
        out=out, address=args.ray_address, storage=args.ray_storage, max_failures=args.max_failures
    )
    out.mkdir(parents=True, exist_ok=True)
    name = _run_name(job, out, found.storage, args.resume)
    cuda = job.training.device.startswith("cuda")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")  # the loop sets its own directory
    workers = nodes * nproc
    _init_ray(found.address, workers)
    try:
        _check_resources(workers, cuda)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        relay = None
        if args.events or args.stop_file:
            absolute = [
                str(Path(p).resolve()) if p else None for p in (args.events, args.stop_file)
            ]
            actor = ray.remote(num_cpus=0)(_relay_class())
            relay = actor.options(scheduling_strategy=here).remote(*absolute)
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={
                "job": job.to_dict(),
                "out": str(out),
                "cwd": os.getcwd(),
                "resume": str(Path(args.resume).resolve())
                if args.resume not in (None, "auto")
                else args.resume,
                "events": bool(args.events),
                "stop_file": bool(args.stop_file),
                "export_extra": cli.parse_export_extra(args.export_extra),
                "relay": relay,
            },
            torch_config=TorchConfig(backend=distributed.BACKEND if cuda else "gloo"),
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=cuda),
            run_config=RunConfig(
                name=name,
                storage_path=found.storage,
                failure_config=FailureConfig(max_failures=found.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=job.checkpoint.keep + 1),
            ),
        )
        try:
            result = trainer.fit()
        except ray.train.TrainingFailedError as err:
            code, message = _failure_code(err)
            print(message, file=sys.stderr)
            return code
        if relay is not None:
            ray.get(relay.close.remote())
        _materialize(result, out)
    finally:
        ray.shutdown()
    report = json.loads((out / "report.json").read_text())
    print(json.dumps(cli.summary(report), indent=2))
    return 0 if report["status"] == "completed" else 3


def main(argv: list[str] | None = None) -> int:
    parsed = cli.parse_command(argv)
    if parsed is None:
        return 2
    args, data = parsed
    try:
        job = JobConfig.from_dict(data)
        nproc = args.nproc_per_node or job.training.devices
        nodes = args.nnodes or job.training.nodes
        cli.check_world(job, nproc, nodes)
        cli.parse_export_extra(args.export_extra)  # refused here, before Ray starts
        try:
            import ray.train  # noqa: F401
        except ImportError as err:
            raise ConfigError(
                "training.nodes",
                f"Ray Train cannot be imported ({err}): install {ray_launch.EXTRA}",
            ) from None
        return run(args, job, nproc, nodes)
    except ConfigError as err:
        print(f"error: invalid config: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
