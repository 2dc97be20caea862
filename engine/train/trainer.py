"""The training loop: one readable pass over a stage schedule (nanoGPT ``train.py`` shape).

``Trainer(job, workdir=...)`` builds the data, the model (dense or tensorized) and the
optimizer; ``run()`` walks the stages of ``job.schedule``. Per step::

    out = workload.forward_loss(model, batch)           task loss L and metric sums
    J   = rank_control.objective(L)                      early: L + gamma R; late: the
                                                         achievement scalarization; finetune: L
    J.backward(); rank_control.after_backward()          importances, the next auto gamma
    clip; optimizer.step()

how a step runs is set by ``training``: ``fast_path`` opens a group-merge session around the
forward (:mod:`engine.train.fast_path`), ``precision="bf16"`` runs it under bfloat16 autocast
(:mod:`engine.train.precision`), and ``cuda_graph`` captures the whole step above as one CUDA
graph and replays it (:mod:`engine.train.cuda_graphs`), captured again after every shrink and
at every stage switch.

Every ``compression.shrink_every`` steps the dead ranks are sliced out of the cores and the
Adam moments. Late stages cut towards their size target gradually, under the fidelity guard
(:mod:`engine.train.prune_events`), distilled from the model at their start
(:mod:`engine.train.teacher`), and early stages with ``gamma: "auto"`` pace their penalty
(:mod:`engine.train.rank_control`).
Side effects go through callbacks; ``should_stop`` is polled between steps (cooperative
cancellation: the trainer writes a checkpoint and returns ``"cancelled"``). Checkpoints hold
the whole state, so ``Trainer(..., resume=path).run()`` continues bitwise as if never
interrupted (CPU, float32).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from engine.nn.dropout import mask_stream
from engine.rank import model_size
from engine.train import distributed as ddp
from engine.train import persist
from engine.train.callbacks import Callback, CallbackList
from engine.train.config import ConfigError, StageConfig
from engine.train.execution import StepExecution
from engine.train.job import JobConfig
from engine.train.observe import emit_ranks, evaluate_parts, evaluate_stage
from engine.train.optim import set_stage_lrs
from engine.train.parts import build_parts, check_distributed
from engine.train.prune_events import end_cuts, rank_event
from engine.train.refactor_stage import refactor_stage_
from engine.train.report import job_report
from engine.train.state import TrainState
from engine.train.teacher import StageTeacher, stage_teacher, teacher_output, teacher_weight

__all__ = ["Trainer", "TrainResult"]


@dataclass
class TrainResult:
    status: str  # "completed" | "cancelled"
    report: dict[str, Any]
    checkpoint: Path | None
    model: nn.Module


def _float(t: Tensor | float) -> float:
    return float(t.item()) if isinstance(t, Tensor) else float(t)


def _late_reference(stages: list[dict[str, Any]]) -> float | None:
    """The guard's reference (the metric at its start) of the last late stage, if guarded: a
    finetune after it must not end more than the tolerance below it."""
    for report in reversed(stages):
        if report["kind"] == "late":
            guard = report.get("guard")
            return guard.get("reference") if isinstance(guard, dict) else None
    return None


class Trainer:
    def __init__(
        self,
        job: JobConfig,
        *,
        workdir: str | Path,
        callbacks: Iterable[Callback] = (),
        should_stop: Callable[[], bool] | None = None,
        resume: str | Path | None = None,
    ) -> None:
        self.job = job
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.dist = ddp.current()  # data parallel when the process group has > 1 process
        main = self.dist is None or self.dist.main
        self.events = CallbackList(callbacks if main else ())  # side effects on rank 0 only
        self.should_stop = should_stop or (lambda: False)
        self.device = torch.device(job.training.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("training.device", "CUDA was asked for but is not available")
        if self.dist is not None:
            self.device = check_distributed(job, self.dist, self.device)
        parts = build_parts(job, self.workdir, self.device, self.dist, fresh=resume is None)
        self.workload, self.data, self.model_config = parts.workload, parts.data, parts.model_config
        self.model, self.setup, self.names = parts.model, parts.setup, parts.names
        self.optimizer, self.control = parts.optimizer, parts.control
        self.state = TrainState()
        self.window: dict[str, Tensor] = {}  # metric sums since the last log
        self._window_t0 = time.perf_counter()
        self._label_counts: Tensor | None = None
        self._rows: tuple[int, int, int] | None = None  # (start, stop, global batch rows)
        self.checkpoints: list[Path] = []
        self.teacher: StageTeacher | None = None  # the model at the last late stage's start
        self.refactored: dict[str, Any] = {}  # layers a late stage's linear_d rewrote
        self.parallel = (
            None if self.dist is None else ddp.DataParallel(self.dist, self.model, self.workload)
        )
        if resume is not None:
            persist.resume_(self, Path(resume))
        self.execution = StepExecution(
            self.model, self.optimizer, self.device, job.training, tensorized=job.tensorized
        )  # after resume: lr tensors

    # -- checkpoints ------------------------------------------------------------------------
    def _checkpoint(self, *, partial: bool = False, final: bool = False) -> Path:
        return persist.save(self, partial=partial, final=final)

    # -- data ---------------------------------------------------------------------------------
    def _stage_length(self, stage: StageConfig) -> int | None:
        return stage.length(self.data.train.num_batches())

    def _batches(self, stage: StageConfig) -> Iterator[dict[str, Tensor]]:
        """Batches of the current stage from the saved position (epoch, batch)."""
        s = self.state
        while True:
            if s.stage_stopped:
                return
            limit = stage.step_limit
            if limit is not None and s.stage_step >= limit:
                return
            if stage.epochs is not None and s.epoch >= s.stage_epoch0 + stage.epochs:
                return
            for batch in self.data.train.batches(s.epoch, start=s.batch):  # resume mid-epoch
                yield batch
                if s.stage_stopped or (limit is not None and s.stage_step >= limit):
                    return
            s.epoch, s.batch = s.epoch + 1, 0

    # -- stages -----------------------------------------------------------------------------
    def _start_stage(self, index: int, stage: StageConfig) -> None:
        s = self.state
        refactored = refactor_stage_(self, stage)  # before the stage's size and teacher
        if stage.epochs is not None and s.batch > 0:  # epoch stages start on a fresh epoch
            s.epoch, s.batch = s.epoch + 1, 0
        self.execution.invalidate()  # the objective's constants change with the stage
        s.stage_epoch0, s.stage_stopped = s.epoch, False
        s.stage_size0 = model_size(self.model) if self.control is not None else None
        out = teacher_output(self.workload)
        self.teacher = stage_teacher(self.teacher, self.model, stage, self._distill(stage), out)
        s.size_ref = s.loss_ref = None
        s.stage_total = self._stage_length(stage)
        needs_total = stage.lr_schedule == "cosine" or (
            self.control is not None and stage.target_ratio is not None
        )
        if s.stage_total is None and needs_total:  # one counting pass
            s.stage_total = self.data.train.count() * (stage.epochs or 0)
        if stage.target_ratio is not None and s.stage_size0 is not None:
            s.size_ref = stage.target_ratio * s.stage_size0
        metrics: dict[str, float] = {}
        if stage.kind == "late":
            metrics = self._evaluate(stage) or s.last_eval
            if stage.loss_ref is not None:
                s.loss_ref = stage.loss_ref
            elif "loss" not in metrics and not stage.auto_steps:  # "auto": J = L, no L*
                raise ConfigError(
                    f"schedule[{index}].loss_ref",
                    "no validation data to take L* from: set loss_ref",
                )
            else:
                s.loss_ref = metrics.get("loss")
        reference = _late_reference(s.stages) if stage.kind == "finetune" else None
        if reference is not None:  # the finetune's guard: its start model is the one the last
            metrics = s.last_eval  # stage ended with, evaluated there (in the checkpoint too)
        if self.control is not None:
            self.control.start_stage(stage, s, s.stage_total or 0)
            if stage.kind in ("late", "finetune"):
                self.control.start_guard(s.global_step, metrics, reference)
        s.stage_started = True
        self.events.emit(
            {
                "event": "stage_start",
                "stage": index,
                "kind": stage.kind,
                "label": stage.label,
                "step": s.global_step,
                "size": s.stage_size0,
                "size_ref": s.size_ref,
                "loss_ref": s.loss_ref,
                **({"refactored": refactored} if refactored else {}),
            }
        )
        self._emit_ranks(index, force=True)

    def _end_stage(self, index: int, stage: StageConfig) -> None:
        s, control = self.state, self.control
        final_cut, metrics = end_cuts(self, stage)
        size_end = model_size(self.model) if control is not None else None
        report = {
            "stage": index,
            "kind": stage.kind,
            "label": stage.label,
            "steps": s.stage_step,
            "seconds": round(s.stage_seconds, 3),
            "metrics": metrics,
            "size_start": s.stage_size0,
            "size_end": size_end,
            "size_ref": s.size_ref,
            "loss_ref": s.loss_ref,
            "pruned": final_cut,
        }
        if self.data.valid_parts:  # a mix of text sources: the metrics of each
            report["metrics_by_source"] = evaluate_parts(self)
        if control is not None:
            report.update(control.outcome(size_end, metrics))
            control.end_stage()
        s.stages.append(report)
        if report.get("advice"):  # the ranks held an early stage back: raise max_rank
            self.events.emit({"event": "advice", "step": s.global_step, **report["advice"]})
        self.events.emit({"event": "stage_end", "step": s.global_step, **report})
        self._emit_ranks(index, force=True)
        s.stage, s.stage_step, s.stage_started, s.stage_seconds = index + 1, 0, False, 0.0
        s.stage_stopped, s.control = False, {}

    # -- one step -----------------------------------------------------------------------------
    def _loss(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor], Tensor | None]:
        """``(loss, sums, switch loss)``: the workload's loss; data parallel, through DDP and
        scaled so that the ranks' averaged gradient is the global batch's, with the
        all-reduced loss for the late stage (:mod:`engine.train.distributed`)."""
        if self.parallel is not None:
            return self.parallel.loss(batch)
        out = self.workload.forward_loss(self.model, batch)
        return out.loss, out.sums, None

    def _compute(self, stage: StageConfig, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """One whole step (forward, objective, backward, clip, optimizer); detached sums."""
        weight = self._distill(stage)
        teacher = self.teacher if weight > 0 else None
        watch = teacher.watch(self.model) if teacher is not None else contextlib.nullcontext()
        rows = self._rows  # this process's rows of the global batch: its dropout masks' slice
        with (
            self.execution.forward(),
            watch as seen,
            mask_stream(self.job.training.seed, self.state.global_step, rows),
        ):
            loss, sums, switch = self._loss(batch)
        objective, extra = loss, {}
        if teacher is not None:  # L' = L + w T^2 KL; the late switch still compares L with L*
            # in float32, outside autocast: the frozen copy has no fast-path session, and the
            # eager TT contraction does not run under bf16 autocast
            kd = teacher.loss(seen, stage.teacher_temperature)  # ()
            objective, switch = loss + weight * kd, loss if switch is None else switch
            extra["distill"] = kd.detach()
        if self.control is not None:
            objective, more = self.control.objective(objective, self.state, switch_loss=switch)
            extra.update(more)
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        if self.control is not None:
            self.control.after_backward()
        if self.job.training.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.job.training.grad_clip)
        self.optimizer.step()
        return {**sums, "objective": objective.detach(), **extra}

    def _step(self, stage: StageConfig, batch: Mapping[str, Tensor]) -> None:
        self.model.train()
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        self.execution.prepare(lambda: self.workload.forward_loss(self.model, batch))
        sums = self.execution.run(self.state.stage, batch, lambda b: self._compute(stage, b))
        for k, v in sums.items():
            self.window[k] = self.window[k] + v if k in self.window else v.clone()
        self.state.window_steps += 1

    def _log(self, index: int, stage: StageConfig) -> None:
        w = {k: _float(v) for k, v in self.window.items()}
        if self.parallel is not None:
            w = self.parallel.window(self.window)
        n = self.state.window_steps
        metrics = self.workload.summarize(w)
        event = {
            "event": "step",
            "step": self.state.global_step,
            "stage": index,
            "kind": stage.kind,
            "epoch": self.state.epoch,
            "lr": {g["name"]: _float(g["lr"]) for g in self.optimizer.param_groups},
            "objective": w["objective"] / n,
            "seconds_per_step": (time.perf_counter() - self._window_t0) / n,
            **{f"train_{k}": v for k, v in metrics.items()},
        }
        for key in ("penalty", "lambda", "gamma", "distill"):
            if key in w:
                event[key] = w[key] / n
        if self.control is not None:
            event["size"] = _float(self.control.index.size())
        self.events.emit(event)
        self.window, self.state.window_steps, self._window_t0 = {}, 0, time.perf_counter()

    # -- rank events --------------------------------------------------------------------------
    def _distill(self, stage: StageConfig) -> float:
        """The stage's distillation weight (0: no teacher; :mod:`engine.train.teacher`)."""
        guard_on = self.job.compression.max_metric_drop is not None
        return teacher_weight(stage, self.workload, guard_on)

    def _restored(self) -> None:
        """The guard put a snapshot back: new parameter storage, capture and wrap again."""
        self.execution.invalidate(optimizer_loaded=True)
        if self.parallel is not None:
            self.parallel.invalidate()
        self._emit_ranks(self.state.stage, force=True)

    def _shrink(self) -> None:
        self._sync_gates()
        if self.control is not None and self.control.shrink():
            self.execution.invalidate()  # new parameter and moment storage: capture again
            if self.parallel is not None:
                self.parallel.invalidate()  # DDP fixed the old shapes: wrap again

    def _sync_gates(self) -> None:
        """Data parallel: rank 0's gates everywhere before a rank decision."""
        if self.parallel is not None and self.control is not None:
            self.parallel.sync_gates(self.control.index.gates())

    # -- evaluation, ranks ----------------------------------------------------------------------
    def _evaluate(self, stage: StageConfig) -> dict[str, float]:
        return evaluate_stage(self, stage)

    def _emit_ranks(self, index: int, *, force: bool = False) -> None:
        emit_ranks(self, index, force=force)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> TrainResult:
        s, job = self.state, self.job
        every_ckpt, shrink_every = job.checkpoint.every_steps, job.compression.shrink_every
        for index in range(s.stage, len(job.schedule)):
            stage = job.schedule[index]
            if not s.stage_started:
                self._start_stage(index, stage)
            t0 = time.perf_counter()
            for batch in self._batches(stage):
                if self._stop():
                    s.stage_seconds += time.perf_counter() - t0
                    return self._finish("cancelled", self._checkpoint(partial=True))
                total = next(iter(batch.values())).shape[0]
                self._rows = (0, total, total)
                if self.dist is not None:
                    batch = ddp.shard(batch, self.dist)  # this rank's rows of the global batch
                    if batch is None:  # fewer rows than processes: every rank skips it
                        s.batch += 1
                        continue
                    self._rows = (*ddp.rows_of(total, self.dist), total)
                scale = 1.0 if self.control is None else self.control.lr_scale()
                set_stage_lrs(self.optimizer, stage, s.stage_step, s.stage_total or 0, scale)
                self._step(stage, batch)
                s.batch, s.stage_step, s.global_step = (
                    s.batch + 1,
                    s.stage_step + 1,
                    s.global_step + 1,
                )
                if self.control is not None and self.control.event_due(s.stage_step, s.global_step):
                    rank_event(self, index, stage)
                if self.control is not None and shrink_every and s.global_step % shrink_every == 0:
                    self._shrink()
                    self._emit_ranks(index)
                if s.global_step % job.training.log_every == 0:
                    self._log(index, stage)
                if stage.eval_every and s.stage_step % stage.eval_every == 0:
                    self._evaluate(stage)
                self.events.emit(
                    {
                        "event": "progress",
                        "step": s.global_step,
                        "stage": index,
                        "stage_step": s.stage_step,
                        "stage_steps": s.stage_total,
                    }
                )
                if every_ckpt and s.global_step % every_ckpt == 0:
                    s.stage_seconds += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    self._checkpoint()
            s.stage_seconds += time.perf_counter() - t0
            if s.window_steps:
                self._log(index, stage)
            self._end_stage(index, stage)
        return self._finish("completed", self._checkpoint(final=True))

    def _stop(self) -> bool:
        """``should_stop`` as rank 0 sees it, on every rank at the same step."""
        if self.parallel is None:
            return self.should_stop()
        return self.parallel.stop(self.should_stop(), self.device)

    def _finish(self, status: str, path: Path) -> TrainResult:
        return TrainResult(
            status=status, report=self.report(status), checkpoint=path, model=self.model
        )

    def report(self, status: str) -> dict[str, Any]:
        """What the job did (:func:`engine.train.report.job_report`)."""
        return job_report(self, status)
