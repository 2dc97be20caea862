"""The stage-start teacher: a frozen copy of the model at the start of the last late stage
distils into the shrinking one (docs/method.md#stage-start-teacher).

Each cut of a late stage loses some of what the model knew, and the steps after it recover
towards the labels only. With a teacher they also recover towards the model before the cuts:
in late stages, and in finetune stages after one, the task loss becomes::

    L' = L + w T^2 KL( softmax(z_t / T) || softmax(z_s / T) )       (mean over rows)

with ``z_s`` the student's logits, ``z_t`` the teacher's on the same batch, ``w`` the stage's
``teacher_weight`` and ``T`` its ``teacher_temperature`` (Hinton et al., 2015; ``T^2`` keeps
the gradient's scale independent of ``T``). ``L'`` takes the place of ``L`` in the stage's
objective and in the gates' importances; the late stage's switch still compares ``L`` with
``L*``. Logits of a binary classifier (one per row) are the two classes ``(0, z)``.

A workload has a teacher when its model returns a classifier's logits:
:data:`OUTPUTS` (or the workload's own ``stage_teacher`` attribute: ``"classes"``, logits on
the last dimension; ``"binary"``, one logit per row; ``None``, no teacher). ``teacher_weight``
defaults to :data:`DEFAULT_WEIGHT`, 0: the teacher is opt-in. Measured on the real-data
benchmark (digits and stdlib_modules, 5 folds, targets 0.8 / 0.5 / 0.2, with the backing-off
guard), the teacher in late and finetune stages reached the target in 12 of 30 late stages
against 11 of 30 without it, but the finetune after it ended up to 1.46 points under the
stage start on stdlib_modules where without it the finetune recovered to the start; on digits
it kept cuts from passing the guard (1 of 5 reached at 0.8 and 0.5, against 4 of 5).

The teacher is a deep copy of the student made at the stage start, put in ``eval()`` with its
parameters frozen, outside the student's module tree (no optimizer state, no checkpoint
``model/`` entries); it runs under ``torch.no_grad`` on the inputs the student's forward was
called with (a forward hook on the student records them). Its weights are written into every
checkpoint (``teacher/...``), so a resumed run rebuilds it exactly.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.train import checkpoint as ckpt
from engine.train.config import StageConfig

__all__ = [
    "DEFAULT_WEIGHT",
    "OUTPUTS",
    "Seen",
    "StageTeacher",
    "distill_kl",
    "stage_teacher",
    "teacher_output",
    "teacher_weight",
]

DEFAULT_WEIGHT = 0.0  # opt-in: see the module docstring for the measurement
# what the model of each built-in workload returns, for a stage-start teacher
OUTPUTS: dict[str, str] = {"transformer": "classes", "mlp": "classes", "mlm": "classes"}
OUTPUTS["dlrm"] = "binary"
_PREFIX = "teacher/"


def teacher_output(workload: Any) -> str | None:
    """``"classes"``, ``"binary"`` or ``None`` (no teacher) for ``workload``."""
    return getattr(workload, "stage_teacher", OUTPUTS.get(getattr(workload, "name", "")))


def teacher_weight(stage: StageConfig, workload: Any, guard_on: bool) -> float:
    """The distillation weight of ``stage`` (0: no teacher), defaults resolved."""
    if stage.kind not in ("late", "finetune") or teacher_output(workload) is None:
        return 0.0
    if stage.teacher_weight is not None:
        return float(stage.teacher_weight)
    return DEFAULT_WEIGHT if guard_on else 0.0


def distill_kl(student: Tensor, teacher: Tensor, temperature: float, output: str) -> Tensor:
    """``T^2 KL(p_t || p_s)`` averaged over rows; ``student`` carries the gradient."""
    if output == "binary":  # (B,) one logit per row -> (B, 2)
        student = torch.stack([torch.zeros_like(student), student], -1)
        teacher = torch.stack([torch.zeros_like(teacher), teacher], -1)
    classes, dtype = student.shape[-1], torch.promote_types(student.dtype, torch.float32)
    s = student.to(dtype).reshape(-1, classes) / temperature  # (N, C) at least float32
    t = teacher.to(dtype).reshape(-1, classes) / temperature  # (N, C)
    log_ps = F.log_softmax(s, dim=-1)  # (N, C)
    log_pt = F.log_softmax(t, dim=-1)  # (N, C)
    kl = (log_pt.exp() * (log_pt - log_ps)).sum(-1)  # (N,)
    return kl.mean() * temperature**2  # ()


class Seen:
    """The inputs and output of the student's last forward inside :meth:`StageTeacher.watch`."""

    def __init__(self) -> None:
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.output: Tensor | None = None


class StageTeacher:
    """A frozen copy of the model at a late stage's start (see the module doc)."""

    def __init__(self, model: nn.Module, output: str) -> None:
        self.model, self.output = model, output
        model.eval().requires_grad_(False)
        for p in model.parameters():
            p.grad = None

    @classmethod
    def copy_of(cls, student: nn.Module, output: str) -> StageTeacher:
        """A copy of ``student`` as it is now."""
        teacher = copy.deepcopy(student)
        return cls(teacher, output)

    @classmethod
    def from_tensors(
        cls, student: nn.Module, output: str, tensors: Mapping[str, Tensor]
    ) -> StageTeacher | None:
        """The teacher saved in a checkpoint (``teacher/model/...``), or ``None``: a copy of
        ``student`` given the saved shapes and values."""
        state = {k[len(_PREFIX) :]: v for k, v in tensors.items() if k.startswith(_PREFIX)}
        if not state:
            return None
        teacher = cls.copy_of(student, output)
        ckpt.load_model_state_(teacher.model, state)
        return teacher

    def tensors(self) -> dict[str, Tensor]:
        return {f"{_PREFIX}model/{k}": v for k, v in self.model.state_dict().items()}

    @contextlib.contextmanager
    def watch(self, student: nn.Module) -> Iterator[Seen]:
        """Record the inputs and output of ``student``'s forward calls in the block."""
        seen = Seen()

        def hook(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            seen.args, seen.kwargs, seen.output = args, kwargs, out

        handle = student.register_forward_hook(hook, with_kwargs=True)
        try:
            yield seen
        finally:
            handle.remove()

    @torch.no_grad()
    def logits(self, *args: Any, **kwargs: Any) -> Tensor:
        """The teacher's output on the student's inputs (no graph, eval mode)."""
        return self.model(*args, **kwargs)

    def loss(self, seen: Seen, temperature: float) -> Tensor:
        """``T^2 KL`` of the student's watched output from the teacher's on the same inputs."""
        if not isinstance(seen.output, Tensor):
            raise RuntimeError("the stage-start teacher needs the student's logits (a tensor)")
        target = self.logits(*seen.args, **seen.kwargs)  # (B, C) or (B,)
        return distill_kl(seen.output, target.detach(), temperature, self.output)


def stage_teacher(
    current: StageTeacher | None, student: nn.Module, stage: StageConfig, weight: float, out: Any
) -> StageTeacher | None:
    """The teacher of a stage that begins now: a fresh copy at a late stage's start, the one of
    the last late stage in a finetune stage, none otherwise (or with weight 0)."""
    if weight <= 0 or out is None:
        return None if stage.kind != "finetune" else current
    if stage.kind == "late":
        return StageTeacher.copy_of(student, out)
    return current if stage.kind == "finetune" else None
