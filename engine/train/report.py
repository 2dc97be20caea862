"""The report of a training run: what it did, what it reached, and whether it learned.

:func:`job_report` gives the method, architecture, parameter counts, every stage's report
(metrics, sizes, time, prune events, the guard's verdict), the compression of the tensorized
layers and of the whole model at the active ranks, the ranks per layer, the last size target
(``target``: reached or not, the ratio reached and why not), the chance check of the final
accuracy (``chance``: :func:`engine.train.evaluation.chance_report`) and how the steps ran
(fast path, precision, CUDA graphs, data parallelism).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.rank import compression_summary, rank_snapshot
from engine.train.evaluation import chance_report

if TYPE_CHECKING:
    from engine.train.trainer import Trainer

__all__ = ["job_report", "target_summary"]


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
