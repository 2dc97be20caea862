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
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from engine.data.errors import DataError
from engine.train.callbacks import Callback, JsonlWriter
from engine.train.config import ConfigError
from engine.train.job import JobConfig

__all__ = ["main", "run_job"]


class RichProgress(Callback):
    """A progress bar on a terminal: stage, step, loss, accuracy, current compression."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn())
        self.task: Any = None
        self.info = ""

    def on_stage_start(self, event: dict[str, Any]) -> None:
        if self.task is None:
            self.progress.start()
        else:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"stage {event['stage']} {event['label']}",
                                           total=None, info="")

    def on_progress(self, event: dict[str, Any]) -> None:
        self.progress.update(self.task, completed=event["stage_step"],
                             total=event["stage_steps"], info=self.info)

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


def run_job(job: JobConfig, out: Path, *, resume: str | None = None, progress: bool = False,
            callbacks: list[Callback] | None = None) -> dict[str, Any]:
    """Train, export and write the report; returns the report."""
    from engine.export import export_compressed
    from engine.train.trainer import Trainer

    out.mkdir(parents=True, exist_ok=True)
    resume_path = None
    if resume == "auto":
        resume_path = _latest_checkpoint(out)
    elif resume is not None:
        resume_path = Path(resume)
    writer = JsonlWriter(out)
    cbs: list[Callback] = [writer, *(callbacks or [])]
    bar = RichProgress() if progress else None
    if bar is not None:
        cbs.append(bar)
    t0 = time.perf_counter()
    try:
        trainer = Trainer(job, workdir=out, callbacks=cbs, resume=resume_path)
        result = trainer.run()
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    report = result.report
    report["wall_seconds"] = round(time.perf_counter() - t0, 3)
    report["checkpoint"] = {"path": str(result.checkpoint),
                            "bytes": result.checkpoint.stat().st_size if result.checkpoint
                            else None}  # fmt: skip
    if result.status == "completed":
        final_metrics = report["stages"][-1]["metrics"] if report["stages"] else {}
        info = export_compressed(
            result.model, out / "model", arch=job.model.arch,
            model_config=trainer.model_config.to_dict(), options=job.compression.options.to_dict(),
            tensorized=job.tensorized, metrics=final_metrics,
            extra={"job": job.name, "method": job.method})
        report["export"] = {"path": str(info.path), "bytes": info.file_bytes,
                            "sha256": info.sha256, "totals": info.manifest.get("totals")}
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="job config (JSON)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--resume", default=None,
                        help="'auto' (latest checkpoint in OUT) or a checkpoint path")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        data = json.loads(Path(args.config).read_text())
    except (OSError, json.JSONDecodeError) as err:
        print(f"error: cannot read config {args.config}: {err}", file=sys.stderr)
        return 2
    try:
        job = JobConfig.from_dict(data)
        report = run_job(job, Path(args.out), resume=args.resume,
                         progress=not args.no_progress and sys.stderr.isatty())
    except ConfigError as err:
        print(f"error: invalid config: {err}", file=sys.stderr)
        return 2
    except DataError as err:  # a malformed row: file, line and what was expected
        print(f"error: bad data: {err}", file=sys.stderr)
        return 2
    summary = {k: report.get(k) for k in ("status", "method", "arch", "steps", "wall_seconds")}
    if "compression" in report:
        summary["tensorized_ratio"] = report["compression"].get("tensorized_ratio")
    if report["stages"]:
        summary["final_metrics"] = report["stages"][-1]["metrics"]
    print(json.dumps(summary, indent=2))
    return 0
