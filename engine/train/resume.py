"""Can a checkpoint continue this job? The rule of exact resume and of branching.

A checkpoint continues a job whose config equals the saved one, except ``name``, stages not
yet begun (so one early stage can branch into several late-stage schedules) and how steps run
(``training.fast_path``, ``training.cuda_graph``, and the world size: ``training.devices``,
``training.nodes``; resuming at another world size is allowed and close, at the same one
bitwise). Defaults are filled in on both sides first,
so a checkpoint written before a field existed still matches a job that leaves it unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.train.job import JobConfig
from engine.train.state import TrainState

__all__ = ["check_compatible"]

# training fields that change how a step runs (or on how many processes), not what it computes
_HOW_NOT_WHAT = ("fast_path", "cuda_graph", "devices", "nodes")


def _filled(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` with defaults filled in (an older checkpoint lacks newer fields)."""
    try:
        return JobConfig.from_dict(job).to_dict()
    except ValueError:
        return job  # compared as saved: it differs from any valid config


def _comparable(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` (defaults filled in) without ``name``, ``schedule`` and the fields of
    :data:`_HOW_NOT_WHAT`."""
    out = {k: v for k, v in job.items() if k not in ("name", "schedule")}
    if isinstance(out.get("training"), dict):
        out["training"] = {k: v for k, v in out["training"].items() if k not in _HOW_NOT_WHAT}
    return out


def check_compatible(
    saved: dict[str, Any], job: dict[str, Any], state: TrainState, path: Path
) -> None:
    """A checkpoint continues a job whose config equals the saved one, except ``name``, stages
    not yet begun (so one early stage can branch into several late-stage schedules) and how
    steps run (``training.fast_path``, ``training.cuda_graph``)."""
    begun = state.stage + (1 if state.stage_started else 0)
    saved, job = _filled(saved), _filled(job)  # stages of an older checkpoint lack new fields
    same = _comparable(saved) == _comparable(job)
    if not same or saved["schedule"][:begun] != job["schedule"][:begun]:
        raise ValueError(
            f"{path}: checkpoint was written by a different job config (only the "
            f"name and stages after the first {begun} may differ)"
        )
