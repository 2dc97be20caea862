"""``python -m engine.train --config job.json --out DIR``: one job, no server.

Writes into ``DIR``:

* ``metrics.jsonl``: one JSON object per line for every ``step`` (training window averages),
  ``eval`` (validation metrics) and ``stage_end`` event;
* ``ranks.jsonl``: the rank trajectory, per-layer rank vectors and compression over time;
* ``checkpoints/``: resumable training checkpoints (``--resume auto`` continues the latest);
* ``model/``: the compressed checkpoint (``model.safetensors`` + ``manifest.json``);
* ``report.json``: method, architecture, parameter counts, compression of the tensorized
  layers and of the whole model (measured on the saved file), checkpoint bytes, metrics and
  wall time per stage, ranks per layer;
* ``tokenizer.json`` when the job trained a tokenizer.

A bad config exits with status 2 and a message that names the field.

Data parallel: ``training.devices: N`` (or ``--nproc-per-node N``, which overrides it) runs
the job on ``N`` processes under ``torchrun`` (:mod:`engine.train.launch`); rank 0 writes the
outputs. ``training.nodes: M`` above 1 (or ``--nnodes M``) runs it on ``M x N`` workers through
Ray Train (:mod:`engine.train.ray_launch`, the optional extra ``comera-service[ray]``;
``--ray-address``, ``--ray-storage``, ``--max-failures``). ``--events FILE`` appends every
training event as a JSON line (for a parent process following the job) and ``--stop-file FILE``
stops the job with a partial checkpoint (exit status 3) when that file appears.
``--export-extra JSON`` adds the keys of a JSON object to the export manifest's ``extra``
(beside the report's ``execution``, ``target`` and ``chance``): how a parent names the job
the export belongs to.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.data.errors import DataError
from engine.train import distributed
from engine.train.callbacks import Callback, JsonlWriter
from engine.train.config import ConfigError
from engine.train.job import JobConfig
from engine.train.refactor_stage import export_options

__all__ = ["build_parser", "check_world", "main", "parse_export_extra", "run_job", "summary"]


class RichProgress(Callback):
    """A progress bar on a terminal: stage, step, loss, accuracy, current compression."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
        )
        self.task: Any = None
        self.info = ""

    def on_stage_start(self, event: dict[str, Any]) -> None:
        if self.task is None:
            self.progress.start()
        else:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(
            f"stage {event['stage']} {event['label']}", total=None, info=""
        )

    def on_progress(self, event: dict[str, Any]) -> None:
        self.progress.update(
            self.task, completed=event["stage_step"], total=event["stage_steps"], info=self.info
        )

    def on_step(self, event: dict[str, Any]) -> None:
        parts = [f"loss {event['train_loss']:.4f}"]
        if "train_accuracy" in event:
            parts.append(f"acc {event['train_accuracy']:.3f}")
        if "size" in event:
            parts.append(f"S {int(event['size']):,}")
        self.info = "  ".join(parts)

    def on_eval(self, event: dict[str, Any]) -> None:
        if "ratio" in event and event["ratio"] is not None:
            self.info += f"  {event['ratio']:.1f}x"

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()


def _latest_checkpoint(out: Path) -> Path | None:
    found = sorted((out / "checkpoints").glob("step-*.safetensors"))
    return found[-1] if found else None


class EventFile(Callback):
    """Every event as one JSON line of ``path``, flushed as written (a parent follows it)."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_"):
            return object.__getattribute__(self, "write")
        return object.__getattribute__(self, name)

    def write(self, event: dict[str, Any]) -> None:
        self.file.write(json.dumps(event, sort_keys=True) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def run_job(
    job: JobConfig,
    out: Path,
    *,
    resume: str | None = None,
    progress: bool = False,
    callbacks: list[Callback] | None = None,
    events: Path | None = None,
    stop_file: Path | None = None,
    should_stop: Callable[[], bool] | None = None,
    trainer_cls: type | None = None,
    export_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train, export, measure the export's fidelity (``hf_bert``) and write the report;
    returns the report (every rank's; only rank 0 writes files and measures).
    ``should_stop`` is polled when there is no ``stop_file``; ``trainer_cls``: a
    :class:`~engine.train.trainer.Trainer` subclass (Ray Train's reports at checkpoints);
    ``export_extra``: more keys of the export manifest's ``extra``."""
    from engine.export import export_compressed
    from engine.train.fidelity import measure_fidelity
    from engine.train.trainer import Trainer

    ctx = distributed.current()
    main = ctx is None or ctx.main
    out.mkdir(parents=True, exist_ok=True)
    resume_path = None
    if resume == "auto":
        resume_path = _latest_checkpoint(out)
    elif resume is not None:
        resume_path = Path(resume)
    closers: list[Any] = []
    cbs: list[Callback] = list(callbacks or [])
    if main:
        closers.append(JsonlWriter(out))
        if events is not None:
            closers.append(EventFile(events))
        if progress:
            closers.append(RichProgress())
        cbs = [*closers, *cbs]
    t0 = time.perf_counter()
    try:
        trainer = (trainer_cls or Trainer)(
            job,
            workdir=out,
            callbacks=cbs,
            resume=resume_path,
            should_stop=(lambda: stop_file.exists()) if stop_file is not None else should_stop,
        )
        result = trainer.run()
    finally:
        for c in closers:
            c.close()
    report = result.report
    if not main:
        return report
    report["wall_seconds"] = round(time.perf_counter() - t0, 3)
    report["checkpoint"] = {
        "path": str(result.checkpoint),
        "bytes": result.checkpoint.stat().st_size if result.checkpoint else None,
    }
    if result.status == "completed":
        final_metrics = report["stages"][-1]["metrics"] if report["stages"] else {}
        info = export_compressed(
            result.model,
            out / "model",
            arch=job.model.arch,
            model_config=trainer.model_config.to_dict(),
            options=export_options(trainer),
            tensorized=job.tensorized,
            metrics=final_metrics,
            extra={
                "job": job.name,
                "method": job.method,
                **{k: report.get(k) for k in ("execution", "target", "chance")},
                **(export_extra or {}),
            },
        )
        report["export"] = {
            "path": str(info.path),
            "bytes": info.file_bytes,
            "sha256": info.sha256,
            "totals": info.manifest.get("totals"),
        }
        report["fidelity"] = measure_fidelity(trainer, out / "model")
        if job.model.arch == "hf":
            from engine.train.hf_outputs import hf_outputs

            report["hf_export"] = hf_outputs(trainer, out / "model")
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def build_parser() -> argparse.ArgumentParser:
    """The command line (also parsed by the Ray driver, :mod:`engine.train.ray_driver`)."""
    parser = argparse.ArgumentParser(
        prog="python -m engine.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="job config (JSON)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--resume", default=None, help="'auto' (latest checkpoint in OUT) or a checkpoint path"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="data-parallel processes (overrides training.devices)",
    )
    parser.add_argument(
        "--nnodes", type=int, default=None, help="machines, through Ray (overrides training.nodes)"
    )
    parser.add_argument("--events", default=None, help="append every event as a JSON line")
    parser.add_argument("--stop-file", default=None, help="stop when this file appears")
    parser.add_argument(
        "--export-extra", default=None, help="JSON object: more keys of the manifest's extra"
    )
    ray = parser.add_argument_group("multi-node (Ray Train; see engine.train.ray_launch)")
    ray.add_argument("--ray-address", default=None, help="Ray cluster (else COMERA_RAY_ADDRESS)")
    ray.add_argument("--ray-storage", default=None, help="shared storage (else COMERA_RAY_STORAGE)")
    ray.add_argument("--max-failures", type=int, default=None, help="worker group restarts")
    return parser


def parse_command(argv: list[str] | None) -> tuple[argparse.Namespace, Any] | None:
    """The parsed ``argv`` and the JSON of its ``--config`` file; ``None``, after saying why
    on stderr, when that file cannot be read (exit status 2)."""
    args = build_parser().parse_args(argv)
    try:
        return args, json.loads(Path(args.config).read_text())
    except (OSError, json.JSONDecodeError) as err:
        print(f"error: cannot read config {args.config}: {err}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    parsed = parse_command(argv)
    if parsed is None:
        return 2
    args, data = parsed
    try:
        export_extra = parse_export_extra(args.export_extra)
        job = JobConfig.from_dict(data)
        nproc = args.nproc_per_node or job.training.devices
        nodes = args.nnodes or job.training.nodes
        launch = "WORLD_SIZE" not in os.environ  # not yet inside a process group
        if nodes > 1 and launch:  # a Ray Train driver runs the workers
            check_world(job, nproc, nodes)
            from engine.train.ray_launch import run_ray_driver

            return run_ray_driver(argv if argv is not None else sys.argv[1:])
        if nproc > 1 and launch:  # torchrun runs this again in every process
            check_world(job, nproc, 1)
            from engine.train.launch import run_torchrun

            return run_torchrun(_child_args(argv if argv is not None else sys.argv[1:]), nproc)
        ctx = distributed.init_from_env()
        report = run_job(
            job,
            Path(args.out),
            resume=args.resume,
            progress=not args.no_progress and sys.stderr.isatty() and ctx is None,
            events=Path(args.events) if args.events else None,
            stop_file=Path(args.stop_file) if args.stop_file else None,
            export_extra=export_extra,
        )
        if ctx is not None:
            distributed.finish()
            if not ctx.main:
                return 0 if report["status"] == "completed" else 3
    except ConfigError as err:
        print(f"error: invalid config: {err}", file=sys.stderr)
        return 2
    except DataError as err:  # a malformed row: file, line and what was expected
        print(f"error: bad data: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary(report), indent=2))
    return 0 if report["status"] == "completed" else 3


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the command prints when the job ends."""
    out = {k: report.get(k) for k in ("status", "method", "arch", "steps", "wall_seconds")}
    if "compression" in report:
        out["tensorized_ratio"] = report["compression"].get("tensorized_ratio")
    if report["stages"]:
        out["final_metrics"] = report["stages"][-1]["metrics"]
    return out


def parse_export_extra(text: str | None) -> dict[str, Any] | None:
    """``--export-extra``: a JSON object, or a :class:`ConfigError` naming the option."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError("--export-extra", f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ConfigError("--export-extra", f"must be a JSON object, got {type(value).__name__}")
    return value


def check_world(job: JobConfig, nproc: int, nodes: int) -> None:
    """What the processes would refuse, refused here first (exit status 2, not torchrun's 1)."""
    try:  # batch divisible among the processes, no CUDA graph 'on'
        dataclasses.replace(job.training, devices=nproc, nodes=nodes)
    except ConfigError as err:
        raise err.under("training") from None


def _child_args(argv: list[str]) -> list[str]:
    """The CLI arguments for the processes: as given, without ``--nproc-per-node``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--nproc-per-node":
            skip = True
            continue
        if arg.startswith("--nproc-per-node="):
            continue
        out.append(arg)
    return out
