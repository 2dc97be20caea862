"""The trainer's position and stage bookkeeping: everything besides tensors that resume needs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["TrainState"]


@dataclass
class TrainState:
    stage: int = 0  # index into the schedule
    stage_step: int = 0  # optimizer steps taken in this stage
    stage_started: bool = False  # stage_start work (references, events) done
    stage_epoch0: int = 0  # data epoch at which an epoch-length stage began
    global_step: int = 0
    epoch: int = 0  # data epoch of the next batch
    batch: int = 0  # index of the next batch within that epoch
    size_ref: float | None = None  # S* of the current late stage
    loss_ref: float | None = None  # L* of the current late stage
    stage_size0: int | None = None  # S at the start of the current stage
    stage_seconds: float = 0.0  # wall time spent in the current stage so far
    last_eval: dict[str, float] = field(default_factory=dict)
    stages: list[dict[str, Any]] = field(default_factory=list)  # reports of finished stages
    last_ranks: dict[str, list[int]] = field(default_factory=dict)  # active ranks last emitted
    stage_total: int | None = None  # steps of the current stage (None: unknown, not needed)
    stage_stopped: bool = False  # the guard ended the stage early, or an "auto" one reached S*
    control: dict[str, Any] = field(default_factory=dict)  # rank control of the stage (JSON)
    window_steps: int = 0  # steps in the logging window (its sums are checkpoint tensors)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        return cls(**data)
