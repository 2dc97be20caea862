"""The fidelity guard of a pruning stage: cut, check, and back off from a cut that cost too much
(``compression.max_metric_drop``, in metric points: 1.0 = one accuracy point).

A late stage cuts ranks in steps. After each cut has had its recovery steps, the trainer
evaluates; :meth:`FidelityGuard.check` compares the validation metric ``m`` with the one at
the stage start ``m0``::

    within = 100 m >= 100 m0 - max_metric_drop

Within tolerance, the model is the smallest one known to be good: :meth:`accept` keeps a copy
of its parameters, gates and optimizer state, and of the importance window the next cut ranks
entries by (the *snapshot*). Out of tolerance, :meth:`restore` puts the last accepted
snapshot back and the guard **backs off** (:meth:`back_off`): the next cut may remove at most
half the entries of the failed one, and at least one rank (:attr:`cap`), and is judged only
after one more prune interval of recovery steps than the failed one (:attr:`wait`, at most
:data:`MAX_WAIT_FACTOR` intervals), and the stage's learning rates are scaled by
:data:`LR_BACK_OFF` from then on (:attr:`lr_scale`, at least :data:`MIN_LR_SCALE`): a model
falls under the floor by its steps as well as by its cut, and at the rates that made it fall
a retried cut would be judged by the same fall. An accepted cut resets the wait to one
interval; the cap and the rates stay. A model that the objective's penalty (not a cut) took
below the snapshot's size is judged the same way at the next prune event: accepted, or
restored (the cap and wait stay; the rates are lowered as after a failed cut). The stage
goes on until its target is reached or its step budget is spent; it stops only when the failed
cut was a single rank (the smallest cut of any bond: nothing smaller is left to try). Every
back-off and every retried cut's verdict is in :attr:`retries`.

The snapshot lives in host memory and is written into every checkpoint (``guard/...``
tensors), the rest of the state into its JSON, so a resumed run restores exactly what the
uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from engine.train import checkpoint as ckpt

__all__ = [
    "AUTO_MAX_WAIT",
    "LR_BACK_OFF",
    "MAX_WAIT_FACTOR",
    "MIN_LR_SCALE",
    "POINTS",
    "FidelityGuard",
]

POINTS = 100.0  # metric points per unit of the metric (accuracy 0.95 = 95 points)
MAX_WAIT_FACTOR = 4  # a retried cut recovers for at most this many prune intervals
# steps "auto": a cut under the floor recovers for up to this many prune intervals before it is
# undone (stdlib_modules folds 0, 1, 3, 4 at 0.5, 1,500 steps, S* ~5,600 entries: with 4 they
# ended at 6,088 / 6,856 / 10,984 / 6,520 entries, with 10 at 6,088 / 6,288 / 6,816 / 5,288)
AUTO_MAX_WAIT = 10
# a back-off scales the stage's learning rates by this, down to MIN_LR_SCALE of the schedule's
# (stdlib_modules: at the early stage's peak rates the uncut model falls 6.6-11.3 points in 250
# steps, at 0.3x it holds in 4 of 5 folds, at 0.1x in 5: bench.late_rates)
LR_BACK_OFF = 0.5
MIN_LR_SCALE = 0.1
_EXTRA = "extra/"  # snapshot keys of the caller's extra tensors (the importance window)


class FidelityGuard:
    """Reference, tolerance, the smallest good model of one stage and the back-off state."""

    def __init__(self, metric: str, max_drop: float, *, interval: int = 1) -> None:
        self.metric, self.max_drop = metric, float(max_drop)
        self.interval = max(1, int(interval))  # steps between prune events
        self.reference: float | None = None  # m0: the metric at the stage start
        self.accepted: dict[str, Any] = {}  # step, size and metric of the snapshot
        self.snapshot: dict[str, Tensor] = {}
        self.snapshot_meta: dict[str, Any] = {}
        self.cap: int | None = None  # most entries the next cut may remove (None: no limit)
        self.wait = self.interval  # recovery steps before a cut is judged
        self.pending: dict[str, Any] | None = None  # the cut on trial
        self.retries: list[dict[str, Any]] = []  # every back-off and retried cut's verdict
        self.restored_at: int | None = None  # global step of the last restore
        self.lr_scale = 1.0  # of the stage's scheduled learning rates (lowered by back-offs)

    # -- decisions -------------------------------------------------------------------------
    def floor(self) -> float | None:
        """The lowest metric within tolerance (``None`` before the reference is known)."""
        if self.reference is None:
            return None
        return self.reference - self.max_drop / POINTS

    def check(self, metrics: Mapping[str, float]) -> bool:
        """Whether ``metrics`` are within tolerance of the reference (no metric: yes)."""
        low = self.floor()
        value = metrics.get(self.metric)
        return low is None or value is None or value >= low - 1e-12

    def due(self, stage_step: int) -> bool:
        """Whether the cut on trial has had its recovery steps (no cut on trial: no)."""
        return self.pending is not None and stage_step - self.pending["stage_step"] >= self.wait

    def fresh(self, step: int) -> bool:
        """Whether the model is the snapshot as of now (accepted or restored at ``step``)."""
        return self.accepted.get("step") == step or self.restored_at == step

    def limit(self, size: int, bound: float) -> float:
        """The size the next cut may go down to: the bound, or less of a cut after a back-off."""
        return bound if self.cap is None else max(bound, size - self.cap)

    def cut_made(self, step: int, stage_step: int, size_before: int, size_after: int) -> None:
        """A cut is on trial from now."""
        self.pending = {
            "step": step,
            "stage_step": stage_step,
            "size_before": size_before,
            "size_after": size_after,
            "wait": self.wait,
            "retry": bool(self.retries),  # a cut after a back-off
        }

    def passed(self, step: int, size: int, metrics: Mapping[str, float]) -> None:
        """The cut on trial was accepted (after :meth:`accept`): a retry's verdict is logged,
        and the wait halves back towards one prune interval."""
        pending, self.pending = self.pending, None
        if pending is not None and pending["retry"]:
            self.retries.append(self._entry(step, pending, size, metrics, "accept"))
        if pending is not None:
            self.wait = self.interval

    def recovering(self, stage_step: int) -> bool:
        """Whether the cut on trial may recover longer before it is judged failed: it has had
        fewer than :data:`AUTO_MAX_WAIT` prune intervals (``steps: "auto"`` stages)."""
        pending = self.pending
        return pending is not None and (
            stage_step - pending["stage_step"] < AUTO_MAX_WAIT * self.interval
        )

    def extend(self, step: int, size: int, metrics: Mapping[str, float]) -> dict[str, Any]:
        """The cut on trial is under the floor but may recover longer: it is judged again
        after one more prune interval (``recover``; the model and the cut stay)."""
        assert self.pending is not None
        self.wait += self.interval
        entry = self._entry(step, self.pending, size, metrics, "recover")
        entry["next_wait"] = self.wait
        self.retries.append(entry)
        return entry

    def back_off(
        self,
        step: int,
        size: int,
        metrics: Mapping[str, float],
        *,
        one_rank: int | None,
        final: bool,
    ) -> dict[str, Any]:
        """The model at ``size`` failed the check and the snapshot is back (after
        :meth:`restore`): plan the retry (``back_off``), or give up (``stop``: the failed cut
        removed no more than ``one_rank`` entries, the least one cut of the restored model
        removes; ``final``: the stage's budget is spent, ``restore``). Returns the logged
        entry."""
        pending, self.pending = self.pending, None
        trial = pending or {"size_before": self.accepted["size"], "size_after": size}
        failed = trial["size_before"] - trial["size_after"]  # entries the failed cut removed
        if final:
            decision = "restore"
        elif pending is None:
            decision = "back_off"  # the penalty, not a cut, shrank it: the cuts' limits stay
        elif one_rank is None or one_rank >= failed:
            decision = "stop"  # the failed cut was one rank: nothing smaller to try
        else:
            decision = "back_off"
            cap = max(failed // 2, one_rank)  # half the failed cut, at least one rank
            self.cap = cap if self.cap is None else min(self.cap, cap)
            self.wait = min(self.wait + self.interval, MAX_WAIT_FACTOR * self.interval)
        if decision == "back_off":
            self.lr_scale = max(self.lr_scale * LR_BACK_OFF, MIN_LR_SCALE)
        entry = self._entry(step, trial, size, metrics, decision)
        entry.update(
            restored_step=self.accepted["step"],
            restored_size=self.accepted["size"],
            next_cut=self.cap if decision == "back_off" else None,
            next_wait=self.wait if decision == "back_off" else None,
            next_lr_scale=self.lr_scale if decision == "back_off" else None,
            one_rank=one_rank,
            reason=(
                f"validation {self.metric} {entry['metric']:.4f} at size {size} fell below "
                f"{entry['floor']:.4f} (stage start {self.reference:.4f} minus "
                f"max_metric_drop {self.max_drop:g} points): restored the model "
                f"of step {self.accepted['step']} at size {self.accepted['size']}"
            ),
        )
        self.retries.append(entry)
        self.restored_at = step
        return entry

    def _entry(
        self,
        step: int,
        trial: Mapping[str, Any],
        size: int,
        metrics: Mapping[str, float],
        decision: str,
    ) -> dict[str, Any]:
        return {
            "step": step,
            "cut_step": trial.get("step"),
            "size_before": trial["size_before"],
            "size_cut": trial.get("size_after"),
            "size_after": size,
            "metric": metrics.get(self.metric),
            "floor": self.floor(),
            "decision": decision,
        }

    # -- snapshots ---------------------------------------------------------------------------
    def accept(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        names: Mapping[nn.Parameter, str],
        *,
        step: int,
        size: int,
        metrics: Mapping[str, float],
        extra: Mapping[str, Tensor] | None = None,
    ) -> None:
        """Keep the current model, optimizer state and ``extra`` tensors as the smallest good
        model."""
        if self.reference is None:
            self.reference = metrics.get(self.metric)
        tensors = {f"model/{k}": v for k, v in model.state_dict().items()}
        opt_tensors, opt_meta = ckpt.optimizer_tensors(optimizer, names)
        tensors.update(opt_tensors)
        tensors.update({f"{_EXTRA}{k}": v for k, v in (extra or {}).items()})
        self.snapshot = {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}
        self.snapshot_meta = opt_meta
        self.accepted = {"step": step, "size": size, "metric": metrics.get(self.metric)}

    def restore(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        names: Mapping[nn.Parameter, str],
    ) -> dict[str, Tensor]:
        """Put the snapshot back (parameters take their snapshot shapes); returns the extra
        tensors given to :meth:`accept` (on the host)."""
        if not self.snapshot:
            raise RuntimeError("the fidelity guard has no snapshot to restore")
        for p in model.parameters():  # gradients of the cut shapes would outlive the restore
            p.grad = None
        ckpt.load_model_state_(model, self.snapshot)
        groups = [dict(g) for g in optimizer.param_groups]  # keep the live learning rates
        ckpt.load_optimizer_state_(optimizer, names, self.snapshot, self.snapshot_meta)
        for group, live in zip(optimizer.param_groups, groups, strict=True):
            for key, value in live.items():
                if key != "params":
                    group[key] = value
        return {k[len(_EXTRA) :]: v for k, v in self.snapshot.items() if k.startswith(_EXTRA)}

    # -- checkpoints -------------------------------------------------------------------------
    def tensors(self) -> dict[str, Tensor]:
        return {f"guard/{k}": v for k, v in self.snapshot.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "max_drop": self.max_drop,
            "reference": self.reference,
            "accepted": self.accepted,
            "snapshot_meta": self.snapshot_meta,
            "interval": self.interval,
            "cap": self.cap,
            "wait": self.wait,
            "pending": self.pending,
            "retries": self.retries,
            "restored_at": self.restored_at,
            "lr_scale": self.lr_scale,
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> FidelityGuard:
        guard = cls(data["metric"], data["max_drop"], interval=data.get("interval", 1))
        guard.reference = data["reference"]
        guard.accepted = dict(data["accepted"])
        guard.snapshot_meta = dict(data["snapshot_meta"])
        guard.cap, guard.wait = data.get("cap"), data.get("wait", guard.interval)
        guard.pending = data.get("pending")
        guard.retries = [dict(r) for r in data.get("retries", [])]
        guard.restored_at = data.get("restored_at")
        guard.lr_scale = float(data.get("lr_scale", 1.0))
        guard.snapshot = {
            k[len("guard/") :]: v for k, v in tensors.items() if k.startswith("guard/")
        }
        return guard
