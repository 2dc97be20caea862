"""A late stage's ``linear_d``: the trainer's side of :mod:`engine.rank.refactor`.

At the start of a late stage, every TT linear of fewer modes per side than the stage's
:func:`stage_linear_d` is rewritten exactly in that many (the output does not change); the
optimizer, the parameter names of checkpoints, the rank index and any captured step follow.
Not given, it is 2 where the engine chose two cores itself (``max_rank: "auto"`` without
``d``: its late stages cut more bonds, docs/method.md#late-refactor), else 1 (as built); a
layer whose modes the job gives (``compression.modes``) keeps them unless ``linear_d`` is
given.

A resumed run rewrites the model it built before loading a checkpoint, for every begun stage,
the layers whose cores in the checkpoint have the rewritten form (a checkpoint written before
the rewrite existed keeps its two cores), so the checkpoint's tensors find their shapes
(:func:`engine.train.persist.resume_`). What was rewritten is kept on the trainer
(``refactored``): the stage-start event and the export's options name it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from engine.models.tensorize import TensorizeOptions
from engine.nn.tt_linear import TTLinear
from engine.rank.refactor import refactor_model_
from engine.train.config import StageConfig

if TYPE_CHECKING:
    from engine.train.trainer import Trainer

__all__ = ["AUTO_LATE_LINEAR_D", "stage_linear_d", "refactor_stage_", "export_options"]

AUTO_LATE_LINEAR_D = 2  # the late stages of a job whose TT linears the engine built of two cores


def stage_linear_d(stage: StageConfig, options: TensorizeOptions) -> int:
    """The modes per side ``stage`` rewrites TT linears into (1: none; module doc)."""
    if stage.kind != "late":
        return 1
    if stage.linear_d is not None:
        return stage.linear_d
    chosen = options.max_rank == "auto" and options.engine_two_cores  # the job's options
    return AUTO_LATE_LINEAR_D if chosen else 1


def refactor_stage_(
    trainer: Trainer, stage: StageConfig, saved: Mapping[str, Tensor] | None = None
) -> dict[str, Any]:
    """Rewrite ``trainer``'s TT linears as ``stage`` asks (module doc); per layer what
    changed (empty: nothing did). ``saved``: a checkpoint's tensors, resuming: only the
    layers whose cores there have the rewritten form."""
    options = trainer.job.compression.options
    d = stage_linear_d(stage, options)
    if d == 1 or trainer.control is None:
        return {}
    layers = [n for n, m in trainer.model.named_modules() if isinstance(m, TTLinear)]
    only = set(layers)
    if stage.linear_d is None:  # the default: the layers whose modes the user did not give
        only = {n for n in only if options.explicit_modes(n) is None}
    if saved is not None:
        only = {n for n in only if f"model/{n}.cores.{2 * d - 1}" in saved}
    exact = saved is None  # resuming: the load gives the values
    done = refactor_model_(trainer.model, d, trainer.optimizer, only=only, exact=exact)
    if not done:
        return done
    names = {p: n for n, p in trainer.model.named_parameters()}
    trainer.names.clear()  # the dict the rank control shares
    trainer.names.update(names)
    trainer.control.index.refresh()
    execution = getattr(trainer, "execution", None)  # not built yet while resuming
    if execution is not None:
        execution.invalidate()
        if execution.fast is not None:
            execution.fast.forget()
    if trainer.parallel is not None:
        trainer.parallel.invalidate()
    trainer.refactored.update(done)
    return done


def export_options(trainer: Trainer) -> dict[str, Any]:
    """The job's tensorize options as a dict, with the modes of every refactored layer
    pinned by its exact name (first in ``modes``: the first match wins), so a compressed
    checkpoint rebuilds the layers as they were trained."""
    options = trainer.job.compression.options.to_dict()
    pinned = {
        name: {"in": rec["in_modes"], "out": rec["out_modes"]}
        for name, rec in trainer.refactored.items()
    }
    options["modes"] = {**pinned, **options["modes"]}
    return options
