"""How the trainer runs a step: the fast path, the precision and CUDA graphs (``training``).

:class:`StepExecution` holds the three choices of :class:`engine.train.config.TrainingConfig`
for one model and optimizer and gives the trainer four verbs: ``forward()`` (the context of a
forward: autocast and the fast path's session), ``prepare(forward_fn)`` (learn the fast path's
sibling runs once, before the first step, so a resumed run fuses what the uninterrupted one
did), ``run(key, batch, step_fn)`` (eager or a replayed graph) and ``invalidate()`` (after a
shrink, a stage switch or a checkpoint load). ``report()`` says what actually ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from engine.train.config import ConfigError, TrainingConfig
from engine.train.cuda_graphs import GraphedStep, graphs_supported, prepare_optimizer_
from engine.train.fast_path import FastPath, supports_fast_path
from engine.train.precision import autocast

__all__ = ["StepExecution"]


class StepExecution:
    """Fast path, precision and CUDA graphs of one training run (see the module doc)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        training: TrainingConfig,
        *,
        tensorized: bool,
    ) -> None:
        self.model, self.device, self.training = model, device, training
        use_fast = training.fast_path and supports_fast_path(model)
        self.fast = FastPath(model) if use_fast else None
        if training.precision == "bf16" and self.fast is None and tensorized:
            raise ConfigError(
                "training.precision",
                "bf16 runs TT layers through the fast path, "
                "which this model cannot use (blocks recomputed in backward)",
            )
        self.graphs = self._graphed_step(optimizer, training.cuda_graph)

    def _graphed_step(self, optimizer: torch.optim.Optimizer, mode: str) -> GraphedStep | None:
        why = "off" if mode == "off" else graphs_supported(self.device, optimizer)
        if why is not None:
            if mode == "on":
                raise ConfigError("training.cuda_graph", why)
            for group in optimizer.param_groups:  # restored from a checkpoint of a graphed run
                if group.get("capturable"):
                    group["capturable"] = False
            return None
        prepare_optimizer_(optimizer, self.device)
        return GraphedStep(optimizer, mode)

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """Precision (autocast) and the fast path's session around one forward."""
        session = self.fast.session() if self.fast is not None else contextlib.nullcontext()
        with autocast(self.device, self.training.precision), session:
            yield

    def prepare(self, forward_fn: Callable[[], object]) -> None:
        """Before a run's first step: the fast path learns its sibling runs from a probe."""
        if self.fast is not None and not self.fast.learned:
            with autocast(self.device, self.training.precision):
                self.fast.probe(forward_fn)

    def run(
        self,
        key: Hashable,
        batch: Mapping[str, Tensor],
        step_fn: Callable[[Mapping[str, Tensor]], dict[str, Tensor]],
    ) -> dict[str, Tensor]:
        """One step: replayed from a graph, or ``step_fn(batch)`` eagerly."""
        if self.graphs is None:
            return step_fn(batch)
        return self.graphs(key, batch, step_fn)

    def invalidate(self, *, optimizer_loaded: bool = False) -> None:
        """Parameters, optimizer state or the objective changed: capture again.
        ``optimizer_loaded``: the optimizer state was replaced (a guard restore): its step
        counters go back to the device first."""
        if self.graphs is not None:
            if optimizer_loaded:
                prepare_optimizer_(self.graphs.optimizer, self.device)
            self.graphs.invalidate()

    def report(self) -> dict[str, Any]:
        g = self.graphs
        return {
            "fast_path": self.fast is not None,
            "precision": self.training.precision,
            "cuda_graph": {
                "mode": self.training.cuda_graph,
                "used": g is not None,
                "captures": g.captures if g else 0,
                "replays": g.replays if g else 0,
                "failure": g.failure if g else None,
            },
        }
