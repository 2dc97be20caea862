"""What a job leaves for the run to choose, as the plan (``:validate``) states it.

``max_rank: "auto"`` and ``gamma: "auto"`` are chosen from the data while the job runs, so a
plan cannot give their values; it gives the rule, the bounds, what the plan assumed in their
place (the layers and the memory estimate are planned at the rank cap, the most the choice
can be, and count the dense calibration run when it needs more memory than training), and
where the run reports what it chose. A late stage's ``linear_d`` (given, or the engine's
default) is stated with the stages it applies to. ``None`` when the job leaves nothing to
choose.
"""

from __future__ import annotations

from typing import Any

from engine.train.auto_rank import AUTO_RANK_CAP, TOLERANCE, probe_steps
from engine.train.job import JobConfig
from engine.train.refactor_stage import stage_linear_d

__all__ = ["automatic_choices"]


def automatic_choices(cfg: JobConfig) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    options = cfg.compression.options
    if cfg.tensorized and options.max_rank == "auto":
        steps = probe_steps(cfg)
        out["max_rank"] = {
            "value": "auto",
            "rule": (
                f"the dense twin of the model trains {steps} steps (the first stage's learning "
                f"rates, the job's seed); each TT layer takes the smallest rank whose TT-SVD "
                f"of its dense weight keeps a relative error <= {TOLERANCE}, at most "
                f"{AUTO_RANK_CAP}; every layer starts at the largest layer's choice, from the "
                f"TT-SVD of the dense twin's weight (the twin's other weights copied)"
                + (
                    "; with no d given, each TT linear has two cores (a rank-r product U V)"
                    if options.engine_two_cores
                    else ""
                )
            ),
            "calibration_steps": steps,
            "tolerance": TOLERANCE,
            "cap": AUTO_RANK_CAP,
            "planned_at": AUTO_RANK_CAP,
            "linear_d": options.linear_order,
            "reported_in": "the report's auto_rank: per layer the rank, its error and whether "
            "the cap held it; probe.start: each layer's error at the start",
        }
    rewrite = {i: stage_linear_d(st, options) for i, st in enumerate(cfg.schedule)}
    late = [i for i, d in rewrite.items() if d > 1]
    if cfg.tensorized and late:
        out["linear_d"] = {
            "value": [rewrite[i] for i in late],
            "stages": late,
            "given": [cfg.schedule[i].linear_d is not None for i in late],
            "rule": (
                "at the start of these late stages every TT linear of fewer modes per side is "
                "rewritten exactly in this many (the output does not change), so the stage can "
                "cut bonds a two-core layer lacks; not given, 2 where the engine chose two "
                "cores (max_rank 'auto' without d), the layers the job gives modes for kept"
            ),
            "reported_in": "the late stage's stage_start event: refactored, per layer the "
            "ranks before and after and the new modes",
        }
    stages = [i for i, stage in enumerate(cfg.schedule) if stage.gamma == "auto"]
    if stages:
        out["gamma"] = {
            "value": "auto",
            "stages": stages,
            "rule": (
                "after each step the penalty's weight follows the ratio of the task's and the "
                "penalty's gradients on the gates; with a stage target_ratio the size bound "
                "falls gradually towards it"
            ),
            "reported_in": "each early stage report's gamma and the logged gamma metric",
        }
    return out or None
