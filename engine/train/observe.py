"""What the trainer reports while it runs: validation (``eval`` events; at a stage's end also
on each source of a mixed validation split) and active ranks (``ranks`` events, only when they
changed unless forced)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.rank import compression_summary, model_size, rank_snapshot
from engine.train.config import StageConfig
from engine.train.evaluation import evaluate

if TYPE_CHECKING:
    from engine.train.trainer import Trainer

__all__ = ["evaluate_stage", "evaluate_parts", "emit_ranks"]


def evaluate_stage(t: Trainer, stage: StageConfig) -> dict[str, float]:
    """Validation metrics of the model now (``{}`` without validation data); an ``eval`` event."""
    if t.data.valid is None:
        return {}
    metrics, t._label_counts = _evaluate_on(t, t.data.valid)
    t.state.last_eval = metrics
    event = {
        "event": "eval",
        "step": t.state.global_step,
        "stage": t.state.stage,
        "kind": stage.kind,
        **{f"valid_{k}": v for k, v in metrics.items()},
    }
    if t.control is not None:
        event.update(
            size=model_size(t.model),
            ratio=compression_summary(t.model)["tensorized_ratio"],
        )
    t.events.emit(event)
    return metrics


def evaluate_parts(t: Trainer) -> dict[str, dict[str, float]]:
    """Validation metrics of the model now on each part of the validation rows
    (``DataBundle.valid_parts``: a mix of text sources, each reported apart)."""
    return {name: _evaluate_on(t, part)[0] for name, part in t.data.valid_parts.items()}


def _evaluate_on(t: Trainer, source: Any) -> tuple[dict[str, float], Any]:
    """:func:`~engine.train.evaluation.evaluate` of the model now on ``source``'s batches."""
    return evaluate(
        t.model,
        t.workload,
        source.batches(0),
        device=t.device,
        forward_context=t.execution.forward,
        limit=t.job.training.eval_batches,
    )


def emit_ranks(t: Trainer, index: int, *, force: bool = False) -> None:
    """A ``ranks`` event when the active ranks changed since the last one (or ``force``)."""
    if t.control is None:
        return
    snap = rank_snapshot(t.model)
    active = {name: list(layer["active_ranks"]) for name, layer in snap.items()}
    if not force and active == t.state.last_ranks:
        return
    t.state.last_ranks = active
    t.events.emit(
        {
            "event": "ranks",
            "step": t.state.global_step,
            "stage": index,
            "layers": snap,
            "totals": compression_summary(t.model),
        }
    )
