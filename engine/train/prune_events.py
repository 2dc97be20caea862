"""The trainer's side of a pruning stage: what happens at a prune event and at the stage's end
(docs/method.md#prune-events, docs/method.md#fidelity-guard).

At a prune event of a guarded late stage, :func:`rank_event`

1. judges the last cut once it has had its recovery steps (:meth:`RankControl.judge_due`):
   ``accept`` keeps it; ``back_off`` restores the last accepted model and retries smaller at
   once (the restored importance window ranks the entries as before); ``stop`` ends the stage;
   a cut still recovering makes the event a plain training step. Without a cut on trial, a
   model the penalty took below the snapshot's size (:meth:`RankControl.shrunk`) is judged
   the same way (a failure restores the snapshot; the cuts' cap and wait stay);
2. before a cut on a model that is not the snapshot, evaluates it and, within tolerance,
   makes it the snapshot (so a back-off restores the model that was cut, not an older one);
3. cuts to the size bound (capped after a back-off) and shrinks.

A ``steps: "auto"`` stage ends at the event where an accepted model is at or below ``S*``
(:meth:`RankControl.reached`); its cuts wait for the last one's verdict (the event of a cut
still recovering only trains), so the pace is the measured recovery.

Every verdict is a ``guard`` event (step, sizes before and after, metric, decision) and an
entry of the stage report's ``retries`` when it concerns a back-off or a retried cut.
:func:`end_cuts` judges a cut still on trial, then (if it passed) makes the final cut to ``S*``
and judges it: the stage's budget is spent, so a failure restores without a retry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.rank import model_size
from engine.train.config import StageConfig

if TYPE_CHECKING:
    from engine.train.trainer import Trainer

__all__ = ["rank_event", "end_cuts"]


def rank_event(t: Trainer, index: int, stage: StageConfig) -> None:
    """Guard (late), cut to the size bound and shrink at a prune event."""
    s, control = t.state, t.control
    assert control is not None
    t._sync_gates()
    if control.guarded() and (control.dirty or control.shrunk()):
        if control.dirty and not control.judge_due(s.stage_step):
            return  # the cut on trial is still recovering
        metrics = t._evaluate(stage)
        verdict = _verdict(t, stage, metrics, final=False) if metrics else None
        if verdict == "stop":
            s.stage_stopped = True
        if verdict in ("stop", "recover"):
            return  # "recover": the cut on trial recovers one more interval
    if control.reached(s.global_step):  # steps "auto": the target, accepted: the stage ends
        s.stage_stopped = True
        return
    if control.wants_snapshot(s.global_step) and control.cut_planned(s.stage_step):
        metrics = t._evaluate(stage)
        if control.refresh(s.global_step, metrics):
            _emit(t, stage, "accept", model_size(t.model), None, metrics, final=False)
    if control.cut(s.stage_step, s.global_step) is not None:
        t._shrink()
        t._emit_ranks(index)
        if not control.guarded() and control.reached(s.global_step):
            s.stage_stopped = True  # steps "auto" with no guard: the last cut reached S*


def end_cuts(t: Trainer, stage: StageConfig) -> tuple[dict[str, Any] | None, dict[str, float]]:
    """The end of a stage: ``(final cut, validation metrics)`` (a late stage's final cut to
    ``S*`` under the guard; any stage's last evaluation)."""
    s, control = t.state, t.control
    final_cut = None
    if (
        control is not None
        and stage.kind == "late"
        and not s.stage_stopped
        and model_size(t.model) > (s.size_ref or 0)
    ):
        verdict = "accept"
        if control.guarded() and control.dirty:
            metrics = t._evaluate(stage)  # the cut on trial first: the final one goes on top
            if metrics:
                verdict = _verdict(t, stage, metrics, final=True)
        if verdict == "accept":  # a failed trial leaves the last accepted model: budget spent
            final_cut = control.cut(s.stage_total or 0, s.global_step, final=True)
            t._shrink()
    metrics = t._evaluate(stage)
    if control is not None and control.guarded() and not s.stage_stopped and metrics:
        if _verdict(t, stage, metrics, final=True) != "accept":
            metrics = t._evaluate(stage)
    return final_cut, metrics


def _verdict(t: Trainer, stage: StageConfig, metrics: dict[str, float], *, final: bool) -> str:
    """Judge the model just evaluated; restore on failure; emit the ``guard`` event."""
    s, control = t.state, t.control
    assert control is not None and control.guard is not None
    size = model_size(t.model)
    pending = control.guard.pending
    decision = control.judge(s.global_step, metrics, final=final, stage_step=s.stage_step)
    if decision not in ("accept", "recover"):
        t._restored()
    _emit(t, stage, decision, size, pending, metrics, final=final)
    return decision


def _emit(
    t: Trainer,
    stage: StageConfig,
    decision: str,
    size: int,
    pending: dict[str, Any] | None,
    metrics: dict[str, float],
    *,
    final: bool,
) -> None:
    """The ``guard`` event of a verdict (an accept without a cut on trial: the uncut model
    became the snapshot before a cut)."""
    control = t.control
    assert control is not None and control.guard is not None
    event = {
        "event": "guard",
        "step": t.state.global_step,
        "stage": t.state.stage,
        "kind": stage.kind,
        "decision": decision,
        "cut": pending is not None,
        "size_before": pending["size_before"] if pending else size,
        "size_cut": pending["size_after"] if pending else size,
        "size_after": size,
        "size_now": model_size(t.model),
        "metric": control.metric,
        "value": metrics.get(control.metric),
        "floor": control.guard.floor(),
        "final": final,
    }
    if decision != "accept":
        guard = control.guard
        event.update(next_cut=guard.cap, next_wait=guard.wait, lr_scale=guard.lr_scale)
    t.events.emit(event)
