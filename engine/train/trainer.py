"""The training loop: one readable pass over a stage schedule (nanoGPT ``train.py`` shape).

``Trainer(job, workdir=...)`` builds the data, the model (dense or tensorized) and the
optimizer; ``run()`` walks the stages of ``job.schedule``. Per step::

    out = workload.forward_loss(model, batch)           task loss L and metric sums
    early:    J = L + gamma * R                           (engine.rank.objectives)
    late:     J, lam = achievement scalarization with (L*, S*)
    finetune: J = L (gate learning rate 0, so S cannot grow)
    J.backward(); clip; optimizer.step()

how a step runs is set by ``training``: ``fast_path`` opens a group-merge session around the
forward (:mod:`engine.train.fast_path`), ``precision="bf16"`` runs it under bfloat16 autocast
(:mod:`engine.train.precision`), and ``cuda_graph`` captures the whole step above as one CUDA
graph and replays it (:mod:`engine.train.cuda_graphs`), captured again after every shrink and
at every stage switch.

every ``compression.shrink_every`` steps the dead ranks are sliced out of the cores and the
Adam moments (Part B item 6); at the end of a late stage the target is met by pruning
(Part B item 5). Side effects go through callbacks; ``should_stop`` is polled between steps
(cooperative cancellation: the trainer writes a checkpoint and returns ``"cancelled"``).
Checkpoints hold the whole state, so ``Trainer(..., resume=path).run()`` continues bitwise
as if never interrupted (CPU, float32).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import engine
from engine.data import build_data
from engine.models.registry import get_workload
from engine.rank import (
    GateIndex,
    compression_summary,
    early_objective,
    late_objective,
    model_size,
    prune_to_target_,
    rank_snapshot,
    shrink_model_,
    tensorized_layers,
)
from engine.train import checkpoint as ckpt
from engine.train.callbacks import Callback, CallbackList
from engine.train.config import ConfigError, StageConfig, as_config_error
from engine.train.execution import StepExecution
from engine.train.job import JobConfig
from engine.train.optim import build_optimizer, set_stage_lrs
from engine.train.state import TrainState

__all__ = ["Trainer", "TrainResult"]


@dataclass
class TrainResult:
    status: str  # "completed" | "cancelled"
    report: dict[str, Any]
    checkpoint: Path | None
    model: nn.Module


def _float(t: Tensor | float) -> float:
    return float(t.item()) if isinstance(t, Tensor) else float(t)


_HOW_NOT_WHAT = ("fast_path", "cuda_graph")  # training fields that change how a step runs only


def _comparable(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` with defaults filled in (an older checkpoint lacks newer fields), without
    ``name``, ``schedule`` and the fields of :data:`_HOW_NOT_WHAT`."""
    try:
        job = JobConfig.from_dict(job).to_dict()
    except ValueError:
        pass  # compared as saved: it differs from any valid config
    out = {k: v for k, v in job.items() if k not in ("name", "schedule")}
    if isinstance(out.get("training"), dict):
        out["training"] = {k: v for k, v in out["training"].items() if k not in _HOW_NOT_WHAT}
    return out


def _check_compatible(saved: dict[str, Any], job: dict[str, Any], state: TrainState,
                      path: Path) -> None:
    """A checkpoint continues a job whose config equals the saved one, except ``name``, stages
    not yet begun (so one early stage can branch into several late-stage schedules) and how
    steps run (``training.fast_path``, ``training.cuda_graph``)."""
    begun = state.stage + (1 if state.stage_started else 0)
    same = _comparable(saved) == _comparable(job)
    if not same or saved["schedule"][:begun] != job["schedule"][:begun]:
        raise ValueError(f"{path}: checkpoint was written by a different job config (only the "
                         f"name and stages after the first {begun} may differ)")


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
        self.events = CallbackList(callbacks)
        self.should_stop = should_stop or (lambda: False)
        self.device = torch.device(job.training.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("training.device", "CUDA was asked for but is not available")
        torch.manual_seed(job.training.seed)
        self.workload = get_workload(job.model.arch)
        self.data = build_data(job.data, arch=job.model.arch, batch_size=job.training.batch_size,
                               seed=job.training.seed, workdir=self.workdir,
                               model_config=job.model.config)
        self.model_config = job.model_config(self.data.model_overrides)
        opts = job.compression.options
        try:
            self.model = self.workload.build(self.model_config, tensorized=job.tensorized,
                                             options=opts).to(self.device)
        except ValueError as err:  # a stage or option that does not fit the model
            raise as_config_error(err, "compression") from None
        if job.tensorized and not tensorized_layers(self.model):
            raise ConfigError("compression.layers", f"no layer of the {job.model.arch!r} "
                              f"model matches {list(opts.layers)}: nothing to compress")
        if resume is None:  # data-dependent init (hf_bert: whitened TT-SVD); resume restores
            self.workload.prepare(self.model, self.data.train.batches(0), device=self.device)
        self.setup = self.workload.setup(self.model, self.data.train, job, device=self.device)
        self.names = {p: n for n, p in self.model.named_parameters()}
        self.optimizer = build_optimizer(
            self.model, job.method, job.schedule[0].lr, options=opts,
            weight_decay=job.training.weight_decay, galore=job.galore)
        self.gates = GateIndex(self.model, job.compression.penalty) if job.tensorized else None
        self.state = TrainState()
        self._window: dict[str, Tensor] = {}
        self._window_steps = 0
        self._window_t0 = time.perf_counter()
        self.checkpoints: list[Path] = []
        if resume is not None:
            self._resume(Path(resume))
        self.execution = StepExecution(self.model, self.optimizer, self.device, job.training,
                                       tensorized=job.tensorized)  # after resume: lr tensors

    # -- checkpoints ------------------------------------------------------------------------
    def _checkpoint(self, *, partial: bool = False, final: bool = False) -> Path:
        tensors = {f"model/{k}": v for k, v in self.model.state_dict().items()}
        opt_tensors, opt_meta = ckpt.optimizer_tensors(self.optimizer, self.names)
        tensors.update(opt_tensors)
        tensors.update(ckpt.rng_tensors())
        meta = {"engine_version": engine.__version__, "job": self.job.to_dict(),
                "state": self.state.to_dict(), "optimizer": opt_meta,
                "model_config": self.model_config.to_dict(), "partial": partial}  # fmt: skip
        # a partial checkpoint (a stop) has a file of its own, outside the rotation: a stop
        # right after a periodic checkpoint neither rewrites nor rotates that one away
        name = "final" if final else f"step-{self.state.global_step:08d}"
        name += "-partial" if partial else ""
        path = ckpt.save_checkpoint(self.workdir / "checkpoints" / f"{name}.safetensors",
                                    tensors, meta)
        if not final and not partial:
            self.checkpoints.append(path)
            while len(self.checkpoints) > self.job.checkpoint.keep:
                self.checkpoints.pop(0).unlink(missing_ok=True)
        self.events.emit({"event": "checkpoint", "path": str(path), "partial": partial,
                          "step": self.state.global_step, "bytes": path.stat().st_size})
        return path

    def _resume(self, path: Path) -> None:
        tensors, meta = ckpt.read_checkpoint(path)
        _check_compatible(meta["job"], self.job.to_dict(), TrainState.from_dict(meta["state"]),
                          path)
        ckpt.load_model_state_(self.model, tensors)
        ckpt.load_optimizer_state_(self.optimizer, self.names, tensors, meta["optimizer"])
        ckpt.restore_rng(tensors)
        self.state = TrainState.from_dict(meta["state"])
        if self.gates is not None:
            self.gates.refresh()
        if hasattr(self, "execution"):
            self.execution.invalidate()

    # -- data ---------------------------------------------------------------------------------
    def _stage_length(self, stage: StageConfig) -> int | None:
        if stage.steps is not None:
            return stage.steps
        per_epoch = self.data.train.num_batches()
        return None if per_epoch is None else per_epoch * (stage.epochs or 0)

    def _batches(self, stage: StageConfig) -> Iterator[dict[str, Tensor]]:
        """Batches of the current stage from the saved position (epoch, batch)."""
        s = self.state
        while True:
            if stage.steps is not None and s.stage_step >= stage.steps:
                return
            if stage.epochs is not None and s.epoch >= s.stage_epoch0 + stage.epochs:
                return
            for batch in self.data.train.batches(s.epoch, start=s.batch):  # resume mid-epoch
                yield batch
                if stage.steps is not None and s.stage_step >= stage.steps:
                    return
            s.epoch, s.batch = s.epoch + 1, 0

    # -- stages -----------------------------------------------------------------------------
    def _start_stage(self, index: int, stage: StageConfig) -> None:
        s = self.state
        if stage.epochs is not None and s.batch > 0:  # epoch stages start on a fresh epoch
            s.epoch, s.batch = s.epoch + 1, 0
        self.execution.invalidate()  # the objective's constants change with the stage
        s.stage_epoch0 = s.epoch
        s.stage_size0 = model_size(self.model) if self.gates is not None else None
        s.size_ref = s.loss_ref = None
        if stage.kind == "late":
            s.size_ref = stage.target_ratio * s.stage_size0  # type: ignore[operator]
            if stage.loss_ref is not None:
                s.loss_ref = stage.loss_ref
            else:
                metrics = self._evaluate(stage) or s.last_eval
                if "loss" not in metrics:
                    raise ConfigError(f"schedule[{index}].loss_ref", "no validation data to "
                                      "take L* from: set loss_ref")
                s.loss_ref = metrics["loss"]
        s.stage_started = True
        self.events.emit({"event": "stage_start", "stage": index, "kind": stage.kind,
                          "label": stage.label, "step": s.global_step, "size": s.stage_size0,
                          "size_ref": s.size_ref, "loss_ref": s.loss_ref})  # fmt: skip
        self._emit_ranks(index, force=True)

    def _end_stage(self, index: int, stage: StageConfig) -> None:
        s = self.state
        pruned = None
        if stage.kind == "late" and s.size_ref is not None and model_size(self.model) > s.size_ref:
            pruned = prune_to_target_(self.model, int(s.size_ref)).to_dict()
            self._shrink(index)
        metrics = self._evaluate(stage)
        report = {"stage": index, "kind": stage.kind, "label": stage.label,
                  "steps": s.stage_step, "seconds": round(s.stage_seconds, 3),
                  "metrics": metrics, "size_start": s.stage_size0,
                  "size_end": model_size(self.model) if self.gates is not None else None,
                  "size_ref": s.size_ref, "loss_ref": s.loss_ref, "pruned": pruned}  # fmt: skip
        s.stages.append(report)
        self.events.emit({"event": "stage_end", "step": s.global_step, **report})
        self._emit_ranks(index, force=True)
        s.stage, s.stage_step, s.stage_started, s.stage_seconds = index + 1, 0, False, 0.0

    # -- one step -----------------------------------------------------------------------------
    def _objective(self, stage: StageConfig, loss: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        if self.gates is None or stage.kind == "finetune":
            return loss, {}
        penalty = self.gates.penalty()  # ()
        if stage.kind == "early":
            return early_objective(loss, penalty, stage.gamma), {"penalty": penalty.detach()}
        size = self.gates.size()  # ()
        j, lam = late_objective(loss, penalty, size, self.state.loss_ref, self.state.size_ref,
                                gamma=stage.gamma, loss_weight=stage.loss_weight)
        return j, {"penalty": penalty.detach(), "lambda": lam}

    def _compute(self, stage: StageConfig, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """One whole step (forward, objective, backward, clip, optimizer); detached sums."""
        with self.execution.forward():
            out = self.workload.forward_loss(self.model, batch)
        objective, extra = self._objective(stage, out.loss)
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        if self.job.training.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.job.training.grad_clip)
        self.optimizer.step()
        return {**out.sums, "objective": objective.detach(), **extra}

    def _step(self, stage: StageConfig, batch: Mapping[str, Tensor]) -> None:
        self.model.train()
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        self.execution.prepare(lambda: self.workload.forward_loss(self.model, batch))
        sums = self.execution.run(self.state.stage, batch, lambda b: self._compute(stage, b))
        for k, v in sums.items():
            self._window[k] = self._window[k] + v if k in self._window else v.clone()
        self._window_steps += 1

    def _log(self, index: int, stage: StageConfig) -> None:
        n, w = self._window_steps, {k: _float(v) for k, v in self._window.items()}
        metrics = self.workload.summarize(w)
        event = {"event": "step", "step": self.state.global_step, "stage": index,
                 "kind": stage.kind, "epoch": self.state.epoch,
                 "lr": {g["name"]: _float(g["lr"]) for g in self.optimizer.param_groups},
                 "objective": w["objective"] / n,
                 "seconds_per_step": (time.perf_counter() - self._window_t0) / n,
                 **{f"train_{k}": v for k, v in metrics.items()}}  # fmt: skip
        if "penalty" in w:
            event["penalty"] = w["penalty"] / n
        if "lambda" in w:
            event["lambda"] = w["lambda"] / n
        if self.gates is not None:
            event["size"] = _float(self.gates.size())
        self.events.emit(event)
        self._window, self._window_steps, self._window_t0 = {}, 0, time.perf_counter()

    # -- evaluation, ranks ----------------------------------------------------------------------
    @torch.no_grad()
    def _evaluate(self, stage: StageConfig) -> dict[str, float]:
        if self.data.valid is None:
            return {}
        self.model.eval()
        sums: dict[str, float] = {}
        limit = self.job.training.eval_batches
        for i, batch in enumerate(self.data.valid.batches(0)):
            if limit is not None and i >= limit:
                break
            batch = {k: v.to(self.device) for k, v in batch.items()}
            with self.execution.forward():
                out = self.workload.forward_loss(self.model, batch)
            for k, v in out.sums.items():
                sums[k] = sums.get(k, 0.0) + _float(v)
        metrics = self.workload.summarize(sums)
        self.state.last_eval = metrics
        event = {"event": "eval", "step": self.state.global_step, "stage": self.state.stage,
                 "kind": stage.kind, **{f"valid_{k}": v for k, v in metrics.items()}}
        if self.gates is not None:
            event.update(size=model_size(self.model),
                         ratio=compression_summary(self.model)["tensorized_ratio"])
        self.events.emit(event)
        return metrics

    def _emit_ranks(self, index: int, *, force: bool = False) -> None:
        if self.gates is None:
            return
        snap = rank_snapshot(self.model)
        active = {name: list(layer["active_ranks"]) for name, layer in snap.items()}
        if not force and active == self.state.last_ranks:
            return
        self.state.last_ranks = active
        self.events.emit({"event": "ranks", "step": self.state.global_step, "stage": index,
                          "layers": snap, "totals": compression_summary(self.model)})

    def _shrink(self, index: int) -> None:
        change = shrink_model_(self.model, self.optimizer)
        if change.changed and self.gates is not None:
            self.gates.refresh()
        if change.changed:  # new parameter and moment storage: capture again
            self.execution.invalidate()

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> TrainResult:
        s, job = self.state, self.job
        every_ckpt, shrink_every = job.checkpoint.every_steps, job.compression.shrink_every
        for index in range(s.stage, len(job.schedule)):
            stage = job.schedule[index]
            if not s.stage_started:
                self._start_stage(index, stage)
            total = self._stage_length(stage)
            if stage.lr_schedule == "cosine" and total is None:  # one counting pass
                total = self.data.train.count() * (stage.epochs or 0)
            t0 = time.perf_counter()
            for batch in self._batches(stage):
                if self.should_stop():
                    s.stage_seconds += time.perf_counter() - t0
                    return self._finish("cancelled", self._checkpoint(partial=True))
                set_stage_lrs(self.optimizer, stage, s.stage_step, total or 0)
                self._step(stage, batch)
                s.batch, s.stage_step, s.global_step = s.batch + 1, s.stage_step + 1, \
                    s.global_step + 1
                if self.gates is not None and shrink_every and s.global_step % shrink_every == 0:
                    self._shrink(index)
                    self._emit_ranks(index)
                if s.global_step % job.training.log_every == 0:
                    self._log(index, stage)
                if stage.eval_every and s.stage_step % stage.eval_every == 0:
                    self._evaluate(stage)
                self.events.emit({"event": "progress", "step": s.global_step, "stage": index,
                                  "stage_step": s.stage_step, "stage_steps": total})
                if every_ckpt and s.global_step % every_ckpt == 0:
                    s.stage_seconds += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    self._checkpoint()
            s.stage_seconds += time.perf_counter() - t0
            if self._window_steps:
                self._log(index, stage)
            self._end_stage(index, stage)
        return self._finish("completed", self._checkpoint(final=True))

    def _finish(self, status: str, path: Path) -> TrainResult:
        return TrainResult(status=status, report=self.report(status), checkpoint=path,
                           model=self.model)

    def report(self, status: str) -> dict[str, Any]:
        """What the job did: method, sizes, compression, metrics and time per stage, ranks."""
        job, model = self.job, self.model
        out: dict[str, Any] = {
            "status": status, "method": job.method, "arch": job.model.arch,
            "model_config": self.model_config.to_dict(), "steps": self.state.global_step,
            "stages": self.state.stages,
            "parameters": sum(p.numel() for p in model.parameters()),
        }  # fmt: skip
        if self.gates is not None:
            out["compression"] = compression_summary(model)
            out["ranks"] = rank_snapshot(model)
        out["execution"] = self.execution.report()  # fast path, precision, CUDA graphs
        if self.setup:
            out["setup"] = self.setup
        return out
