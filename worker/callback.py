"""From the engine's training events to the job's rows (an ``engine.train`` callback).

Metric keys (``metric_points.key``, ``job_latest_metrics.key``):

=====================  ==========================================================
``loss``, ``accuracy``, the training task metrics of a ``step`` event (``train_<name>``,
``perplexity``          averaged over the last ``log_every`` steps), prefix dropped
``objective``           the optimized objective J (loss + penalty terms)
``penalty``             the rank penalty R (CoMERA stages)
``lambda``              the achievement-scalarization weight (late stages)
``size``                the model size S at active ranks (tensorized jobs)
``lr/<group>``          learning rate of each parameter group (``lr/cores``, ...)
``seconds_per_step``    wall time per optimizer step
``val_<name>``          validation metrics of an ``eval`` event (``val_loss``, ...)
``ratio``               compression ratio of the tensorized layers, at each eval
=====================  ==========================================================

Every point carries the stage's name (its ``name`` in the spec, else its kind) and, for
``step`` events, the data epoch. Rank points: one per tensorized layer per ``ranks`` event
(``ranks`` = the active bond ranks). Events (``job_events.kind``): ``stage`` (``phase``
start/end, index, name, kind, step and the stage report), ``rank`` (step, stage, totals and the
active ranks of each layer), ``checkpoint`` (id, kind, step, stage, size, sha256, state), and
``metric`` (one per flush, written by the recorder).

A non-finite training loss raises :class:`NanLoss`, which stops training at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.store.db.crud.jobs import append_event
from worker.artifacts import checkpoint_row, mark_deleted
from worker.recorder import Recorder, finite

__all__ = ["JobCallback", "NanLoss"]

Event = dict[str, Any]
STEP_SKIP = {"event", "step", "stage", "kind", "epoch", "lr"}
EVAL_SKIP = {"event", "step", "stage", "kind", "size"}


class NanLoss(RuntimeError):
    def __init__(self, key: str, step: int, value: Any) -> None:
        super().__init__(f"{key} is {value} at step {step}: training diverged")
        self.key, self.step = key, step


class JobCallback:
    """Feeds a :class:`Recorder` and registers checkpoints.

    Duck-types ``engine.train.Callback`` (one ``on_<event>`` method per event), so this module
    needs no torch.
    """

    def __init__(
        self, *, recorder: Recorder, stage_names: list[str], artifacts: Path, tenant_id: str
    ) -> None:
        self.rec, self.names, self.artifacts, self.tenant_id = (
            recorder,
            stage_names,
            artifacts,
            tenant_id,
        )
        self.stage = 0
        self.epoch: float | None = None
        self.checkpoints: list[str] = []  # ids registered by this attempt, in order
        self.rec.set_progress(stage_count=len(stage_names))

    def _name(self, index: int) -> str | None:
        return self.names[index] if 0 <= index < len(self.names) else None

    def _at_stage(self, index: int) -> None:
        self.stage = index
        self.rec.set_progress(stage_index=index, stage_name=self._name(index))

    # -- engine events ------------------------------------------------------------------------
    def on_progress(self, event: Event) -> None:
        self._at_stage(event["stage"])
        total = self.rec.progress.get("total_steps")
        step = event["step"]
        self.rec.set_progress(step=step, fraction=min(step / total, 1.0) if total else None)
        self.rec.maybe_flush()

    def on_step(self, event: Event) -> None:
        step, name = event["step"], self._name(event["stage"])
        for key in ("train_loss", "objective"):
            if key in event and not finite(event[key]):
                raise NanLoss(key, step, event[key])
        self.epoch = event.get("epoch", self.epoch)
        for key, value in event.items():
            if key not in STEP_SKIP:
                self.rec.metric(
                    key.removeprefix("train_"), step, value, stage=name, epoch=self.epoch
                )
        for group, lr in (event.get("lr") or {}).items():
            self.rec.metric(f"lr/{group}", step, lr, stage=name, epoch=self.epoch)
        self.rec.maybe_flush()

    def on_eval(self, event: Event) -> None:
        step, name = event["step"], self._name(event["stage"])
        for key, value in event.items():
            if key not in EVAL_SKIP:
                key = f"val_{key.removeprefix('valid_')}" if key.startswith("valid_") else key
                self.rec.metric(key, step, value, stage=name, epoch=self.epoch)
        self.rec.maybe_flush()

    def on_ranks(self, event: Event) -> None:
        step, name = event["step"], self._name(event["stage"])
        for tensor, layer in event["layers"].items():
            params, dense = int(layer["params"]), int(layer["dense"])
            self.rec.rank(
                tensor,
                step,
                stage=name,
                kind=layer["kind"],
                ranks=list(layer["active_ranks"]),
                params=params,
                dense=dense,
                ratio=dense / max(params, 1),
            )
        totals = event.get("totals") or {}
        self.rec.set_compression(
            current_ratio=totals.get("model_ratio"),
            params_before=totals.get("model_params_dense"),
            params_now=totals.get("model_params"),
            tensorized_ratio=totals.get("tensorized_ratio"),
        )
        ranks = {t: layer["active_ranks"] for t, layer in event["layers"].items()}
        self.rec.event(
            "rank",
            {
                "step": step,
                "stage": name,
                "ratio": totals.get("tensorized_ratio"),
                "params": totals.get("tensorized_params"),
                "dense": totals.get("tensorized_dense"),
                "model_ratio": totals.get("model_ratio"),
                "ranks": ranks,
            },
        )
        self.rec.maybe_flush()

    def on_stage_start(self, event: Event) -> None:
        index = event["stage"]
        self._at_stage(index)
        data = {k: v for k, v in event.items() if k not in ("event", "stage", "label")}
        self.rec.event(
            "stage", {"phase": "start", "index": index, "name": self._name(index), **data}
        )
        self.rec.flush()

    def on_stage_end(self, event: Event) -> None:
        index = event["stage"]
        data = {k: v for k, v in event.items() if k not in ("event", "stage", "label")}
        if event.get("size_ref") is not None and "target_reached" in event:
            self.rec.set_compression(
                target_reached=bool(event["target_reached"]),
                size_ratio_reached=event.get("ratio_reached"),
                target_reason=event.get("reason"),
            )
        self.rec.event("stage", {"phase": "end", "index": index, "name": self._name(index), **data})
        self.rec.flush()

    def on_checkpoint(self, event: Event) -> None:
        path = Path(event["path"])
        kind = (
            "partial" if event.get("partial") else ("final" if path.stem == "final" else "latest")
        )
        try:
            row = checkpoint_row(
                path=path,
                artifacts=self.artifacts,
                job_id=self.rec.job_id,
                tenant_id=self.tenant_id,
                attempt=self.rec.attempt,
                kind=kind,
                step=int(event["step"]),
                stage=self._name(self.stage),
                metrics=dict(self.rec.latest),
            )
        except FileNotFoundError:
            if kind != "latest":
                raise
            # training in processes of its own: their events are read after the fact, and a
            # periodic checkpoint can be gone already, replaced under ``keep``: nothing to list
            return
        self.rec.row(row)
        self.rec.event(
            "checkpoint",
            {
                "id": row.id,
                "kind": kind,
                "step": row.step,
                "stage": row.stage,
                "size_bytes": row.size_bytes,
                "sha256": row.sha256,
                "state": "complete",
            },
        )

        def deleted(session: Any) -> None:
            for cid in mark_deleted(
                session, job_id=self.rec.job_id, tenant_id=self.tenant_id, artifacts=self.artifacts
            ):
                append_event(
                    session=session,
                    job_id=self.rec.job_id,
                    attempt=self.rec.attempt,
                    kind="checkpoint",
                    data={"id": cid, "state": "deleted"},
                )

        self.checkpoints.append(row.id)
        self.rec.flush(extra=deleted)
