"""The CPU fast path of a training step: group merges and sibling products around a forward.

At small batch a CoMERA step is dominated by per-op overhead, not arithmetic: the MNLI model
issues about 670 small GEMMs per step, most of them merging each TT-linear's cores on its own.
``FastPath(model)`` opens a :class:`engine.nn.premerge.PremergeSession` around each forward::

    fast = FastPath(model)
    with fast.session():
        loss = loss_fn(model(batch))
    loss.backward()

so every group of same-shaped TT-linears is gated and merged with one batched chain of
``bmm`` (:mod:`engine.contract.batched`), forward and backward, self-attention with TT
projections runs in their rank space (:mod:`engine.contract.lowrank_attention`, when its cost
model says so), and layers that read one input (q, k, v) otherwise share one wide GEMM
(:mod:`engine.contract.premerged`). Results equal the eager path up to float rounding (other
GEMM groupings and contraction orders). Not used when the model recomputes blocks in
backward (``config.recompute``: the recomputed forward runs outside the session).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from engine.nn.premerge import PremergeSession
from engine.nn.tt_linear import TTLinear

__all__ = ["FastPath", "supports_fast_path"]


def supports_fast_path(model: nn.Module) -> bool:
    """Whether the fast path can wrap ``model``'s forward (it has TT-linears, no recompute)."""
    config = getattr(model, "config", None)
    if getattr(config, "recompute", False):
        return False
    return any(isinstance(m, TTLinear) for m in model.modules())


class FastPath:
    """Opens a premerge session per forward.

    Sibling runs are learned once, from the first session (or :meth:`probe`), and kept: so two
    runs from the same state fuse the same products and stay bitwise equal (exact resume).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._siblings: dict[int, tuple[int, ...]] = {}
        self.learned = False

    def forget(self) -> None:
        """The model's TT-linears were replaced (a late stage's rewrite): learn the sibling
        runs again from the next session (they are kept by the layers' ids)."""
        self._siblings, self.learned = {}, False

    @property
    def active(self) -> bool:
        return supports_fast_path(self.model)

    @contextlib.contextmanager
    def session(self) -> Iterator[PremergeSession | None]:
        """Context for one forward (the backward may run after it closes)."""
        if not self.active:
            yield None
            return
        layers = [m for m in self.model.modules() if isinstance(m, TTLinear)]
        session = PremergeSession(layers, self._siblings)
        with session:
            yield session
        if not self.learned and session.calls:  # the first session that ran TT-linears
            self._siblings, self.learned = session.learned_siblings(), True

    def probe(self, forward: Callable[[], object]) -> None:
        """Learn the sibling runs from ``forward()`` run once in eval mode without gradients
        (no dropout: no random numbers drawn, nothing trained)."""
        was = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.session():
                forward()
        finally:
            self.model.train(was)
