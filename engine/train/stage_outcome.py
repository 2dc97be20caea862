"""The stage report's fields that rank control knows (docs/method.md#prune-events,
docs/method.md#fidelity-guard, docs/method.md#recovery-paced-stages): whether the size target
was reached and why not, the prune events, the guard's verdicts and back-offs, the pace of a
``steps: "auto"`` stage, the automatic gamma, the early stage's advice when its ranks held
it back (:func:`engine.train.report.early_stage_advice`) and the late stage's when it kept
none of its cuts (:func:`engine.train.report.late_stage_advice`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from engine.rank import tensorized_layers
from engine.train.optim import GROUPS
from engine.train.report import early_stage_advice, late_stage_advice
from engine.tt.shapes import bond_rank_bounds

if TYPE_CHECKING:
    from engine.train.rank_control import RankControl

__all__ = ["active_ranks", "early_advice", "late_advice", "stage_outcome"]


def active_ranks(model: nn.Module) -> dict[str, list[int]]:
    """Per tensorized layer, its internal active ranks."""
    return {n: list(layer.active_ranks()[1:-1]) for n, layer in tensorized_layers(model)}


def stage_outcome(
    control: RankControl, size_end: int | None, metrics: Mapping[str, float]
) -> dict[str, Any]:
    """What the stage reached: target, sizes, prune events, guard (stage report fields);
    an early stage its ranks held back, or a late stage that kept none of its cuts, gets
    ``advice`` (:func:`early_advice`, :func:`late_advice`)."""
    target = control.info.get("target")
    out: dict[str, Any] = {}
    advice = early_advice(control, metrics) or late_advice(control, size_end)
    if advice is not None:
        out["advice"] = advice
    if target is not None and size_end is not None:
        out["target_reached"] = size_end <= target
        out["ratio_reached"] = size_end / control.info["size0"] if control.info["size0"] else None
    if control.info.get("events"):
        out["prune_events"] = control.info["events"]
    retries = control.guard.retries if control.guard is not None else []
    backs = [r for r in retries if r["decision"] not in ("accept", "recover")]
    if control.info.get("stopped"):
        out["stopped"] = control.info["stopped"]
        out["reason"] = control.info["stopped"]["reason"]
    elif target is not None and size_end is not None and size_end > target:
        out["reason"] = "the stage ended above its size target"
        if backs:
            out["reason"] += (
                f": the step budget ran out after {len(backs)} back-off(s) of the "
                f"fidelity guard; the last: {backs[-1]['reason']}"
            )
    if control.guard is not None:
        out["guard"] = {
            "metric": control.metric,
            "max_metric_drop": control.max_metric_drop,
            "reference": control.guard.reference,
            "accepted": control.guard.accepted,
            "back_offs": len(backs),
            "lr_scale": control.guard.lr_scale,  # of the scheduled rates, at the stage's end
        }
        if retries:
            out["retries"] = retries
    elif "guard" in control.info:
        out["guard"] = control.info["guard"]
    if control.info.get("auto_cut") is not None:
        out["paced"] = {
            "first_cut": control.info["auto_cut"],
            "max_steps": control.info["total"],
            "reached_at": control.info.get("reached_at"),
        }
    if control.auto is not None:
        out["gamma"] = {"share": float(control.auto.share), "last": float(control.auto.gamma)}
    return out


def early_advice(control: RankControl, metrics: Mapping[str, float]) -> dict[str, Any] | None:
    """``raise max_rank`` when an early stage ended more than the tolerance under its
    dense twin (``dense_reference``, when the caller ran one) or with every bond that
    ``max_rank`` limited still at that rank (:func:`engine.train.report.early_stage_advice`)."""
    if control.stage is None or control.stage.kind != "early" or "ranks0" not in control.info:
        return None
    ranks0 = control.info["ranks0"]
    bounds = {
        n: list(bond_rank_bounds([math.prod(c.shape[1:-1]) for c in layer.cores]))
        for n, layer in tensorized_layers(control.model)
        if n in ranks0
    }
    dense = (control.dense_reference or {}).get(control.metric)
    tolerance = 1.0 if control.max_metric_drop is None else control.max_metric_drop
    return early_stage_advice(
        ranks_start={n: r for n, r in ranks0.items() if n in bounds},
        ranks_end=active_ranks(control.model),
        bounds=bounds,
        metric=control.metric,
        value=metrics.get(control.metric),
        dense=dense,
        tolerance=tolerance,
        auto_rank=control.auto_rank,
    )


def late_advice(control: RankControl, size_end: int | None) -> dict[str, Any] | None:
    """Lower rates (or a looser target) when a guarded late stage ended above its target
    with none of its cuts kept (:func:`engine.train.report.late_stage_advice`)."""
    stage, guard = control.stage, control.guard
    if stage is None or stage.kind != "late" or guard is None or size_end is None:
        return None
    return late_stage_advice(
        size_start=control.info["size0"],
        size_end=size_end,
        target=control.info.get("target"),
        accepted_size=guard.accepted.get("size"),
        trials=guard.retries,
        metric=control.metric,
        reference=guard.reference,
        tolerance=guard.max_drop,
        lr={g: float(getattr(stage.lr, g)) for g in GROUPS},
        lr_before=control.info.get("lr_before", {}),
    )
