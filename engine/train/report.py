"""The report of a training run: what it did, what it reached, and whether it learned.

:func:`job_report` gives the method, architecture, parameter counts, every stage's report
(metrics, sizes, time, prune events, the guard's verdict), the compression of the tensorized
layers and of the whole model at the active ranks, the ranks per layer, the last size target
(``target``: reached or not, the ratio reached and why not), the chance check of the final
accuracy (``chance``: :func:`engine.train.evaluation.chance_report`) and how the steps ran
(fast path, precision, CUDA graphs, data parallelism).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine.rank import compression_summary, rank_snapshot
from engine.train.evaluation import chance_report

if TYPE_CHECKING:
    from engine.train.trainer import Trainer

__all__ = [
    "LOWER_LATE_LR",
    "RAISE_MAX_RANK",
    "RELAX_LATE_TARGET",
    "early_stage_advice",
    "job_report",
    "late_stage_advice",
    "target_summary",
]

RAISE_MAX_RANK = "raise_max_rank"  # the advice's codes
LOWER_LATE_LR = "lower_late_lr"
RELAX_LATE_TARGET = "relax_late_target"
# a late stage whose rates are this many times those the stage before ended with is said to
# jump (stdlib_modules fold 0: at the early stage's peak rates after its cosine, the uncut
# model fell 7 points in 38 steps; at 0.1x the peak it held: bench/README.md)
RATE_JUMP = 2.0


def job_report(trainer: Trainer, status: str) -> dict[str, Any]:
    """The report of ``trainer``'s run, ending with ``status`` (module docstring)."""
    self = trainer
    job, model = self.job, self.model
    out: dict[str, Any] = {
        "status": status,
        "method": job.method,
        "arch": job.model.arch,
        "model_config": self.model_config.to_dict(),
        "steps": self.state.global_step,
        "stages": self.state.stages,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if self.control is not None:
        if self.control.auto_rank is not None:
            out["auto_rank"] = self.control.auto_rank
        advice = [st["advice"] for st in self.state.stages if st.get("advice")]
        if advice:
            out["advice"] = advice
        out["compression"] = compression_summary(model)
        out["ranks"] = rank_snapshot(model)
        out["target"] = target_summary(self.state.stages)
    classes = getattr(self.model_config, "num_classes", None)
    if status == "completed" and self.state.last_eval:
        out["chance"] = chance_report(self.state.last_eval, self._label_counts, classes)
    out["execution"] = self.execution.report()  # fast path, precision, CUDA graphs
    out["execution"]["distributed"] = self.parallel.report() if self.parallel else None
    if self.setup:
        out["setup"] = self.setup
    return out


def target_summary(stages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last stage with a size target: reached or not, the ratio reached, and why not."""
    with_target = [st for st in stages if st.get("size_ref") is not None]
    if not with_target:
        return None
    last = with_target[-1]
    return {
        "stage": last["stage"],
        "target_reached": bool(last.get("target_reached")),
        "size_target": last["size_ref"],
        "size_end": last["size_end"],
        "ratio_reached": last.get("ratio_reached"),
        "reason": last.get("reason"),
    }


def early_stage_advice(
    *,
    ranks_start: Mapping[str, Sequence[int]],
    ranks_end: Mapping[str, Sequence[int]],
    bounds: Mapping[str, Sequence[int]],
    metric: str,
    value: float | None,
    dense: float | None,
    tolerance: float,
    auto_rank: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The report entry of an early stage that its ranks held back, or None.

    Two signs, either enough: the stage ended more than ``tolerance`` points (1.0 = one
    accuracy point) under its dense twin (``dense``: the twin's ``metric`` when one ran), or
    its ranks saturated: every bond that started below its full TT rank (``bounds``), so at a
    rank the job's ``max_rank`` set, ended at that rank (nothing was given up there: the cap,
    not the data, set the rank), and at least one bond did. The fix in both cases is a larger
    ``max_rank`` (or ``"auto"``); for a job whose ranks ``"auto"`` chose (``auto_rank``, the
    choice's report entry) at its cap, a ``max_rank`` above the cap, given explicitly, or less
    of the cut in the early stage. ``ranks_*``: per layer, the internal active ranks."""
    capped = [
        (name, k)
        for name, start in ranks_start.items()
        for k, r in enumerate(start)
        if r < bounds[name][k]
    ]
    saturated = bool(capped) and all(
        ranks_end.get(name, ranks_start[name])[k] >= ranks_start[name][k] for name, k in capped
    )
    gap = None if dense is None or value is None else 100.0 * (dense - value)
    below = gap is not None and gap > tolerance
    if not (saturated or below):
        return None
    reasons = []
    if below:
        reasons.append(
            f"the early stage ended {gap:.2f} points of {metric} under its dense twin "
            f"({100 * value:.2f} vs {100 * dense:.2f}; tolerance {tolerance:g})"
        )
    if saturated:
        reasons.append(
            f"every bond that max_rank limited ({len(capped)} in "
            f"{len({n for n, _ in capped})} layer(s)) ended at its starting rank: the rank cap, "
            "not the data, set the ranks"
        )
    fix = "raise max_rank (or set it to 'auto')"
    if auto_rank is not None:
        cap = (auto_rank.get("probe") or {}).get("cap")
        build = auto_rank.get("build_rank")
        if auto_rank.get("capped") and cap is not None and build is not None and build >= cap:
            chose = (
                f"max_rank 'auto' chose its cap of {cap} ({', '.join(auto_rank['capped'])} "
                f"needed more): give max_rank above {cap} explicitly"
            )
        else:
            chose = f"max_rank 'auto' chose {build}: give a larger max_rank explicitly"
        fix = (
            f"{chose}, or ask the early stage for a larger target_ratio and leave the rest of "
            "the cut to a late stage under the fidelity guard"
        )
    return {
        "code": RAISE_MAX_RANK,
        "fix": fix,
        "reason": "; ".join(reasons),
        "metric": metric,
        "value": value,
        "dense": dense,
        "gap_points": gap,
        "tolerance": tolerance,
        "saturated": saturated,
        "below_dense": below,
    }


def late_stage_advice(
    *,
    size_start: int,
    size_end: int,
    target: float | None,
    accepted_size: int | None,
    trials: Sequence[Mapping[str, Any]],
    metric: str,
    reference: float | None,
    tolerance: float,
    lr: Mapping[str, float],
    lr_before: Mapping[str, float],
) -> dict[str, Any] | None:
    """The report entry of a guarded late stage that kept none of its cuts, or None.

    It applies when the stage ended above its ``target`` with its last accepted model still of
    its start's size (``accepted_size``) after at least one judged cut (``trials``: the guard's
    verdicts, each with its ``metric`` value). Where the stage's learning rates (``lr``, per
    parameter group) are :data:`RATE_JUMP` times or more those the stage before ended with
    (``lr_before``: the optimizer's rates when the stage began), the fix it names first is
    lower rates: the jump alone can put the model under the floor with no cut at all; the
    other fixes are a larger ``max_metric_drop`` or ``target_ratio``."""
    judged = [t["metric"] for t in trials if t.get("metric") is not None]
    if target is None or size_end <= target or reference is None or not judged:
        return None
    if accepted_size is None or accepted_size < size_start:
        return None  # some cut held: the stage made progress
    best = max(judged)
    gap = 100.0 * (reference - best)
    jumps = {
        g: (lr[g] / lr_before[g] if lr_before[g] > 0 else None)
        for g in lr
        if g in lr_before and lr[g] > 0 and lr[g] >= RATE_JUMP * lr_before[g]
    }
    reasons = [
        f"no cut of the late stage held: the best of its {len(judged)} verdicts was "
        f"{gap:.2f} points of {metric} under the stage start ({100 * best:.2f} vs "
        f"{100 * reference:.2f}; tolerance {tolerance:g})"
    ]
    fix = "give a larger max_metric_drop, or a larger target_ratio"
    if jumps:
        group = max(jumps, key=lambda g: float("inf") if jumps[g] is None else jumps[g])
        factor = jumps[group]
        times = "up from 0" if factor is None else f"{factor:.3g}x"
        if factor is not None and factor > 1000:  # after a cosine to (almost) 0
            times = "over 1000x"
        reasons.append(
            f"it trained at learning rates {times} those the stage before ended with "
            f"({group}: {lr_before[group]:.3g} -> {lr[group]:.3g}), and such a jump can put "
            "the model under the floor with no cut at all"
        )
        fix = (
            f"lower this stage's learning rates towards those the stage before ended with, or {fix}"
        )
    return {
        "code": LOWER_LATE_LR if jumps else RELAX_LATE_TARGET,
        "fix": fix,
        "reason": "; ".join(reasons),
        "metric": metric,
        "value": best,
        "reference": reference,
        "gap_points": gap,
        "tolerance": tolerance,
        "lr": dict(lr),
        "lr_before": dict(lr_before),
        "rate_jump": jumps,
    }
