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

__all__ = ["RAISE_MAX_RANK", "early_stage_advice", "job_report", "target_summary"]

RAISE_MAX_RANK = "raise_max_rank"  # the advice's code


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
