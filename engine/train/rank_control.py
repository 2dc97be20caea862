"""Rank control of a CoMERA job: the stage objectives, the self-tuning penalty, gradual
loss-aware pruning to the size target and the fidelity guard (docs/method.md#stage-objectives,
docs/method.md#gradual-pruning, docs/method.md#fidelity-guard, docs/method.md#automatic-gamma).

Per stage kind:

* ``early``: ``J = L + gamma R``. With ``gamma: "auto"`` the weight comes from
  :class:`engine.rank.auto_gamma.AutoGamma`, paced towards ``S* = target_ratio S0`` along the
  cubic bound of :mod:`engine.rank.schedule` when the stage has a ``target_ratio``.
* ``late``: the achievement scalarization with reference point ``(L*, S*)``, plus **gradual
  pruning**: at every prune event (each shrink step, or every twentieth of the stage when
  ``compression.shrink_every`` is 0) the size bound ``B(t)`` falls from ``S0`` to ``S*``
  (reached at 3/4 of the stage) and the entries that cost least loss per parameter saved
  (:class:`engine.rank.importance.GateImportance` over the batches since the last event) are
  cut until ``S <= B(t)``, each bond kept at ``compression.min_rank_fraction`` of its rank at
  the stage start while others have slack, and only layers with a residual path around them
  may reach rank 0 (:func:`engine.rank.prune.prune_to_target_`). The cut entries are sliced
  away at once (:func:`engine.rank.shrink.shrink_model_`).
  With ``compression.max_metric_drop`` set and validation data, the
  :class:`engine.train.guard.FidelityGuard` judges each cut after its recovery steps (and a
  model the penalty shrank below the last accepted one) and at the end; a cut that left the
  metric more than the tolerance below the stage start is undone (the last accepted model
  comes back, with its optimizer state and importance window) and retried smaller after more
  recovery steps, until the target is reached, the budget is spent (``target_reached:
  false``) or a one-rank cut failed (the stage stops).
  A late stage with ``steps: "auto"`` is **recovery-paced** instead: ``J = L`` (the
  penalty's push on the gates killed entries outside the guard's control: a restored model
  lost the same gates again on every retry), each cut removes at most ``(S0 - S*) / 8``
  (halved after a back-off, doubled back after an accepted cut), the next cut waits for the
  guard's verdict on the last one, a cut under the floor recovers up to ten prune intervals
  before it is undone, and the stage ends at the first accepted model at or below ``S*`` or
  at ``max_steps``.
* ``finetune``: ``J = L``.

All of this state (window of importances, penalty weight, guard snapshot, prune events) is in
the checkpoint, so a resumed run continues bitwise.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from engine.rank import (
    GateIndex,
    early_objective,
    late_objective,
    model_size,
    prune_to_target_,
    shrink_model_,
    tensorized_layers,
)
from engine.rank.auto_gamma import AutoGamma
from engine.rank.importance import GateImportance
from engine.rank.prune import one_rank_cost, rank_floors
from engine.rank.schedule import EARLY_BEGIN, EARLY_END, LATE_BEGIN, LATE_END, size_bound
from engine.train.config import StageConfig
from engine.train.guard import FidelityGuard
from engine.train.stage_outcome import active_ranks, stage_outcome
from engine.train.state import TrainState

__all__ = ["RankControl", "EVENTS_PER_STAGE"]

EVENTS_PER_STAGE = 20  # prune events of a late stage when the job never shrinks
AUTO_CUTS = 8  # steps: "auto": the first cut removes 1/8 of the way from S0 to S*


class RankControl:
    """Everything rank-related the trainer does around its steps (see the module doc)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        names: Mapping[nn.Parameter, str],
        *,
        penalty: str,
        shrink_every: int,
        max_metric_drop: float | None,
        min_rank_fraction: float,
        metric: str,
        bypassed: tuple[str, ...],
    ) -> None:
        self.model, self.optimizer, self.names = model, optimizer, names
        self.index = GateIndex(model, penalty)
        self.shrink_every = shrink_every
        self.max_metric_drop, self.min_rank_fraction = max_metric_drop, min_rank_fraction
        self.metric = metric
        self.removable = {
            n for n, _ in tensorized_layers(model) if any(fnmatch.fnmatch(n, p) for p in bypassed)
        }
        self.importance: GateImportance | None = None
        self.auto: AutoGamma | None = None
        self.guard: FidelityGuard | None = None
        self.stage: StageConfig | None = None
        self.info: dict[str, Any] = {}  # the JSON state of the current stage
        # max_rank "auto": the ranks the job started at and why (engine.train.auto_rank)
        self.auto_rank: dict[str, Any] | None = None
        # the dense twin's validation metrics, when the caller ran one (early-stage advice)
        self.dense_reference: Mapping[str, float] | None = None

    # -- stage boundaries ---------------------------------------------------------------------
    def start_stage(self, stage: StageConfig, state: TrainState, total: int) -> None:
        """Set up a stage that begins now (its references are already in ``state``)."""
        self.stage = stage
        size0 = state.stage_size0 or 0
        target = None if stage.target_ratio is None else stage.target_ratio * size0
        floors = rank_floors(self.model, self.min_rank_fraction)
        for name in self.removable:  # a bypassed layer may go to zero: no floor
            floors[name] = tuple(0 for _ in floors[name])
        self.info = {
            "total": total,
            "size0": size0,
            "target": target,
            "stopped": None,
            "events": [],
            "floors": {k: list(v) for k, v in floors.items()},
            "ranks0": active_ranks(self.model),
            # the rates the stage before ended with (no step of this stage has set them yet)
            "lr_before": {g["name"]: float(g["lr"]) for g in self.optimizer.param_groups},
        }
        if stage.auto_steps and target is not None:  # recovery-paced: a cut's largest size
            self.info["auto_cut"] = max(1, math.ceil((size0 - target) / AUTO_CUTS))
        self._setup(stage)

    def _setup(self, stage: StageConfig) -> None:
        self.stage = stage
        self.index.protect(self.info.get("floors") if stage.gamma == "auto" else None)
        self.auto = AutoGamma(self.index) if stage.gamma == "auto" else None
        cuts = stage.kind == "late" or (stage.kind == "early" and stage.target_ratio is not None)
        self.importance = GateImportance(self.index) if cuts else None
        self.guard = None
        if stage.kind == "late" and self.max_metric_drop is not None:
            self.guard = self._new_guard()

    def _new_guard(self) -> FidelityGuard:
        assert self.max_metric_drop is not None
        interval = self.shrink_every or max(1, self.info.get("total", 0) // EVENTS_PER_STAGE)
        return FidelityGuard(self.metric, self.max_metric_drop, interval=interval)

    def start_guard(
        self, step: int, metrics: Mapping[str, float], reference: float | None = None
    ) -> None:
        """The stage-start model is the first snapshot (``metrics``: evaluated at the start).
        A finetune stage is guarded against the ``reference`` of the late stage before it
        (none: not guarded): it ends with its start model back if it fell under that floor."""
        finetune = self.stage is not None and self.stage.kind == "finetune"
        if finetune and reference is not None and self.max_metric_drop is not None:
            self.guard = self._new_guard()
            self.guard.reference = reference
        if self.guard is not None and metrics.get(self.metric) is not None:
            self._accept(step, model_size(self.model), metrics)
        elif self.guard is not None:
            self.guard = None  # no validation metric: nothing to guard with
            self.info["guard"] = "off: no validation data"

    # -- one step -----------------------------------------------------------------------------
    def objective(
        self, loss: Tensor, state: TrainState, switch_loss: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``J`` of the current stage and what to log (penalty, lambda, gamma).
        ``switch_loss``: the loss the late stage's switch compares with ``L*`` (data parallel:
        the all-reduced one; default ``loss``)."""
        stage = self.stage
        assert stage is not None
        if stage.kind == "finetune":
            return loss, {}
        penalty = self.index.penalty()  # ()
        extra: dict[str, Tensor] = {"penalty": penalty.detach()}
        gamma: Tensor | float = self.auto.gamma if self.auto is not None else stage.gamma
        if self.auto is not None:
            extra["gamma"] = self.auto.gamma.detach().clone()
        if stage.kind == "early":
            self._coefs = (1.0, gamma)
            return early_objective(loss, penalty, gamma), extra
        if stage.auto_steps:  # recovery-paced: only the cuts change the size (see the doc)
            self._coefs = (1.0, 0.0)
            return loss, extra
        j, lam = late_objective(
            loss,
            penalty,
            self.index.size(),
            state.loss_ref,
            state.size_ref,
            gamma=stage.gamma,
            loss_weight=stage.loss_weight,
            switch_loss=switch_loss,
        )
        self._coefs = (stage.loss_weight + 1 - lam, stage.gamma + lam)
        extra["lambda"] = lam
        return j, extra

    def after_backward(self) -> None:
        """Read the gates' gradients (before clipping): importances, the next ``gamma``."""
        if self.stage is None or self.stage.kind == "finetune":
            return
        if self.importance is not None:
            self.importance.update(*self._coefs)
        if self.auto is not None:
            self.auto.update(self._coefs[0])

    # -- between steps ------------------------------------------------------------------------
    def event_due(self, stage_step: int, global_step: int) -> bool:
        """Whether this step ends with a prune (late) or pacing (early) event: every shrink
        step, or every twentieth of the stage when the job never shrinks."""
        if self.importance is None:
            return False  # no cuts in this stage
        if self.shrink_every:
            return global_step % self.shrink_every == 0
        return stage_step % max(1, self.info["total"] // EVENTS_PER_STAGE) == 0

    @property
    def dirty(self) -> bool:
        """Whether the model was cut since the guard last accepted it."""
        return bool(self.info.get("dirty"))

    def bound(self, stage_step: int) -> float | None:
        """The size the model is cut to at ``stage_step``: the cubic schedule of a stage of
        known length; ``steps: "auto"``, one step of ``auto_cut`` below the size now."""
        target = self.info.get("target")
        if target is None:
            return None
        if self.info.get("auto_cut") is not None:
            return max(target, model_size(self.model) - self.info["auto_cut"])
        begin, end = (
            (EARLY_BEGIN, EARLY_END) if self.stage.kind == "early" else (LATE_BEGIN, LATE_END)
        )
        return size_bound(
            stage_step, self.info["total"], self.info["size0"], target, begin=begin, end=end
        )

    def cut_planned(self, stage_step: int) -> bool:
        """Whether :meth:`cut` at ``stage_step`` would cut (the size is above the bound)."""
        bound = self.bound(stage_step)
        return bound is not None and model_size(self.model) > bound

    def cut(self, stage_step: int, step: int, *, final: bool = False) -> dict[str, Any] | None:
        """Late stage: cut to the bound (``final``: to ``S*``) by importance, less after a
        back-off of the guard; the caller shrinks afterwards."""
        bound = self.info.get("target") if final else self.bound(stage_step)
        size = model_size(self.model)
        if self.auto is not None and bound is not None:
            self.auto.pace(size, bound)
        if bound is None or size <= bound:
            return None
        if self.guard is not None:
            if self.importance is not None and int(self.importance.count) == 0:
                return None  # restored to a model without importances yet: gather them first
            bound = self.guard.limit(size, bound)
        scores = dict(
            zip([n for n, _ in tensorized_layers(self.model)], self._scores(), strict=True)
        )
        report = prune_to_target_(
            self.model,
            int(bound),
            scores=scores,
            floors=self.info["floors"],
            removable=self.removable,
        )
        event = {"step": step, "bound": int(bound), **report.to_dict()}
        self.info["events"].append(event)
        self.info["dirty"] = True
        if self.guard is not None:
            self.guard.cut_made(step, stage_step, report.size_before, report.size_after)
        return event

    def _scores(self) -> list[list[Tensor]]:
        """Importances per layer, one tensor per gate vector (model order)."""
        assert self.importance is not None
        pieces = iter(self.index.split(self.importance.scores()))
        return [[next(pieces) for _ in mod.gates] for _, mod in tensorized_layers(self.model)]

    def shrink(self) -> bool:
        """Slice dead ranks away; refresh the index and restart the importance window."""
        change = shrink_model_(self.model, self.optimizer)
        if change.changed:
            self.index.refresh()
        if self.importance is not None:
            self.importance.reset()
        return change.changed

    # -- guard ----------------------------------------------------------------------------------
    def guarded(self) -> bool:
        return self.guard is not None

    def lr_scale(self) -> float:
        """Of the stage's scheduled learning rates: lowered by the guard's back-offs."""
        return 1.0 if self.guard is None else self.guard.lr_scale

    def judge_due(self, stage_step: int) -> bool:
        """Whether the last cut has had its recovery steps and is to be judged now."""
        if self.guard is None or not self.dirty:
            return False
        return self.guard.pending is None or self.guard.due(stage_step)

    def shrunk(self) -> bool:
        """Whether the objective's penalty, not a cut, took the model below the snapshot's
        size (gates it drove under the threshold): that model is judged too."""
        if self.guard is None or self.dirty or not self.guard.accepted:
            return False
        return model_size(self.model) < self.guard.accepted["size"]

    def reached(self, step: int) -> bool:
        """``steps: "auto"``: whether the target is reached by a model the guard accepted (by
        the last cut, with no guard); the stage is then over (``reached_at``: ``step``)."""
        target = self.info.get("target")
        if self.info.get("auto_cut") is None or target is None:
            return False
        if (self.guard is not None and self.dirty) or model_size(self.model) > target:
            return False
        self.info["reached_at"] = step
        return True

    def wants_snapshot(self, step: int) -> bool:
        """Whether a cut is about to be made on a model that is not the snapshot (the
        snapshot would then restore an older model than the one cut)."""
        return self.guard is not None and not self.dirty and not self.guard.fresh(step)

    def refresh(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Before a cut: accept the uncut model as the snapshot if it is within tolerance."""
        assert self.guard is not None
        if not metrics or not self.guard.check(metrics):
            return False
        self._accept(step, model_size(self.model), metrics)
        return True

    def judge(
        self, step: int, metrics: Mapping[str, float], *, final: bool, stage_step: int
    ) -> str:
        """After an evaluation of the cut model: keep it (``accept``), or restore the last
        accepted model and retry smaller (``back_off``), end the stage there (``stop``: the
        next cut would be smaller than one rank) or, at the stage's end, keep the restored
        model (``restore``). A ``steps: "auto"`` stage first gives a failing cut up to
        :data:`engine.train.guard.AUTO_MAX_WAIT` prune intervals of recovery (``recover``:
        the cut stays and is judged again one interval later). The logged entry is the
        guard's last retry."""
        guard = self.guard
        assert guard is not None
        size = model_size(self.model)
        self.info["dirty"] = False
        if guard.check(metrics):
            self._accept(step, size, metrics)
            guard.passed(step, size, metrics)
            if guard.cap is not None and self.info.get("auto_cut") is not None:
                # recovery-paced: an accepted cut lets the next one be twice as large again
                guard.cap = None if 2 * guard.cap >= self.info["auto_cut"] else 2 * guard.cap
            return "accept"
        if self.info.get("auto_cut") is not None and not final and guard.recovering(stage_step):
            guard.extend(step, size, metrics)  # recovery-paced: more steps before a verdict
            self.info["dirty"] = True
            return "recover"
        window = guard.restore(self.model, self.optimizer, self.names)
        self.index.refresh()
        if self.importance is not None:
            self.importance.reset()
            if window:
                n = len("importance/")
                self.importance.load({k[n:]: v for k, v in window.items()})
        entry = guard.back_off(step, size, metrics, one_rank=one_rank_cost(self.model), final=final)
        if entry["decision"] == "stop":
            self.info["stopped"] = {
                "step": step,
                "final": final,
                "reason": f"{entry['reason']}; a smaller cut would be less than one rank "
                f"({entry['one_rank']} entries)",
            }
        return entry["decision"]

    def _accept(self, step: int, size: int, metrics: Mapping[str, float]) -> None:
        assert self.guard is not None
        self.guard.accept(
            self.model,
            self.optimizer,
            self.names,
            step=step,
            size=size,
            metrics=metrics,
            extra=self._window(),
        )

    def _window(self) -> dict[str, Tensor]:
        """The importance window (the snapshot keeps it: a retry ranks entries the same)."""
        if self.importance is None:
            return {}
        return {f"importance/{k}": v for k, v in self.importance.state().items()}

    def outcome(
        self, size_end: int | None, metrics: Mapping[str, float] | None = None
    ) -> dict[str, Any]:
        """What the stage reached (:func:`engine.train.stage_outcome.stage_outcome`)."""
        return stage_outcome(self, size_end, metrics or {})

    def end_stage(self) -> None:
        self.stage, self.importance, self.auto, self.guard, self.info = None, None, None, None, {}
        self.index.protect(None)

    # -- checkpoints ----------------------------------------------------------------------------
    def tensors(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        if self.importance is not None:
            out.update({f"rank/importance/{k}": v for k, v in self.importance.state().items()})
        if self.guard is not None:
            out.update(self.guard.tensors())
        return out

    def to_dict(self) -> dict[str, Any]:
        job = {"auto_rank": self.auto_rank} if self.auto_rank is not None else {}
        if self.stage is None:
            return job
        out: dict[str, Any] = {**job, "info": self.info}
        if self.auto is not None:
            out["auto"] = self.auto.state()
        if self.guard is not None:
            out["guard"] = self.guard.to_dict()
        return out

    def load(
        self, stage: StageConfig | None, data: Mapping[str, Any], tensors: Mapping[str, Tensor]
    ) -> None:
        """Restore a stage in progress from a checkpoint (after the model and optimizer)."""
        self.index.refresh()
        if data.get("auto_rank") is not None:
            self.auto_rank = dict(data["auto_rank"])
        if stage is None or "info" not in data:
            return
        self._setup(stage)
        self.info = dict(data["info"])
        if self.auto is not None and "auto" in data:
            self.auto.load(data["auto"])
        if self.importance is not None and "rank/importance/sums" in tensors:
            self.importance.load({k: tensors[f"rank/importance/{k}"] for k in ("sums", "count")})
        self.guard = FidelityGuard.from_state(data["guard"], tensors) if "guard" in data else None
