"""The whole training step as one CUDA graph: capture once, replay every step
(docs/method.md#cuda-graphs).

A step is forward, penalty, objective, backward, clipping and a *capturable* optimizer step
(``torch.optim.AdamW(capturable=True)``: step counters and learning rates live on the device,
so nothing in the step reads back to the host). :class:`GraphedStep` runs it so::

    first step of a capture key:  the real step, eagerly, on a side stream (lazy state,
                                  workspaces), then capture the same step into a graph
    later steps:                  copy the batch into the static inputs, replay

A capture does not execute, so no step is run twice. What the graph captured is tied to the
storage of every parameter, gradient and optimizer state tensor and to Python constants of
the objective (stage kind, ``gamma``, ``L*``, ``S*``): call :meth:`GraphedStep.invalidate`
after a physical shrink (``p.data`` and Adam moments are replaced), at each stage switch and
after loading a checkpoint; the next step captures again. Learning rates are device tensors
updated in place between replays (:func:`engine.train.optim.set_stage_lrs`). Parameters,
gates included, are updated in place by the replayed optimizer, so updates persist.

A batch whose shapes differ from the captured ones (the short last batch of an epoch) runs
eagerly. ``mode="auto"`` uses graphs on CUDA with an AdamW optimizer and falls back to eager
for good if a capture fails (a host synchronisation or data-dependent shape in the model);
``"on"`` raises instead; ``"off"`` never captures. On the CPU, ``"auto"`` is eager and ``"on"``
raises. Nothing here touches CUDA unless the device is CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

import torch
from torch import Tensor

__all__ = ["GraphedStep", "CudaGraphUnavailableError", "graphs_supported", "prepare_optimizer_"]

StepFn = Callable[[Mapping[str, Tensor]], dict[str, Tensor]]


class CudaGraphUnavailableError(RuntimeError):
    """``cuda_graph="on"`` was asked for where the step cannot be captured."""


def graphs_supported(device: torch.device, optimizer: torch.optim.Optimizer) -> str | None:
    """``None`` when the step can be captured, else why not."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the job runs on {device.type!r}"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if type(optimizer) not in (torch.optim.AdamW, torch.optim.Adam):
        return (
            f"the optimizer {type(optimizer).__name__} has no capturable step "
            "(only torch.optim.Adam / AdamW do)"
        )
    return None


def prepare_optimizer_(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Make ``optimizer`` capturable: ``capturable=True``, learning rates and step counters as
    float32 tensors on ``device`` (lr tensors are then set in place, never reassigned)."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        lr = group["lr"]
        if not isinstance(lr, Tensor) or lr.device != device:
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, Tensor) and (step.device != device or step.dtype != torch.float32):
            state["step"] = step.to(device=device, dtype=torch.float32)


def _signature(batch: Mapping[str, Tensor]) -> tuple:
    return tuple((k, tuple(v.shape), v.dtype, v.device) for k, v in sorted(batch.items()))


class GraphedStep:
    """Capture-and-replay runner of one training step function (see the module doc).

    ``step_fn(batch)`` runs a whole step on ``batch`` and returns detached tensors (metric
    sums); after a replay the same static tensors hold the new values (copy them before the
    next step). ``key`` names what the step captured besides tensors (the stage).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, mode: str = "auto") -> None:
        if mode not in ("auto", "on"):
            raise ValueError(
                f"mode must be 'auto' or 'on' (no GraphedStep for 'off'), got {mode!r}"
            )
        self.optimizer = optimizer
        self.mode = mode
        self.failure: str | None = None  # why capture failed (auto mode then stays eager)
        self.captures = 0
        self.replays = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._key: tuple | None = None
        self._static_in: dict[str, Tensor] = {}
        self._static_out: dict[str, Tensor] = {}

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def invalidate(self) -> None:
        """Drop the graph and its static buffers; the next step captures again."""
        self._graph, self._key = None, None
        self._static_in, self._static_out = {}, {}
        self.optimizer.zero_grad(set_to_none=True)  # gradients lived in the graph's pool

    def __call__(
        self, key: Hashable, batch: Mapping[str, Tensor], step_fn: StepFn
    ) -> dict[str, Tensor]:
        if self.failure is not None:
            return step_fn(batch)
        sig = (key, _signature(batch))
        if self._graph is not None and sig == self._key:
            for name, value in batch.items():
                self._static_in[name].copy_(value, non_blocking=True)
            self._graph.replay()
            self.replays += 1
            return self._static_out
        if self._graph is not None and self._key is not None and key == self._key[0]:
            return step_fn(batch)  # same stage, other shapes (a short last batch): eager
        return self._capture(sig, batch, step_fn)

    def _capture(
        self, sig: tuple, batch: Mapping[str, Tensor], step_fn: StepFn
    ) -> dict[str, Tensor]:
        self.invalidate()
        static_in = {k: v.clone() for k, v in batch.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the real step: warms lazy state, allocator, kernels
            out = {k: v.clone() for k, v in step_fn(static_in).items()}
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            self.optimizer.zero_grad(set_to_none=True)  # gradients allocated in the graph's pool
            with torch.cuda.graph(graph):
                static_out = step_fn(static_in)  # recorded, not run
        except Exception as err:
            if self.mode == "on":
                raise CudaGraphUnavailableError(
                    f"capturing the training step failed: {err}"
                ) from err
            self.failure = f"{type(err).__name__}: {err}"
            self.invalidate()
            return out
        self._graph, self._key = graph, sig
        self._static_in, self._static_out = static_in, static_out
        self.captures += 1
        return out
