"""The size bound of gradual rank pruning: from ``S0`` to ``S*`` along a cubic
(docs/method.md#size-bound).

Zhu & Gupta (2017, "To prune, or not to prune") showed that pruning in many small steps along
a cubic, fast while the model has slack and slow near the target, keeps accuracy far better
than one cut at the end. Over a stage of ``T`` steps the bound is::

    u(t) = clip((t - begin T) / ((end - begin) T), 0, 1)
    B(t) = S* + (S0 - S*) (1 - u(t))^3

so ``B = S0`` until ``begin T``, falls fastest right after, and reaches ``S*`` at ``end T``;
the steps after ``end T`` train the final model (recovery). The late stage cuts to ``B(t)``
at each of its prune events; the early stage's automatic penalty paces the size along it.
"""

from __future__ import annotations

import math

__all__ = ["size_bound", "LATE_BEGIN", "LATE_END", "EARLY_BEGIN", "EARLY_END"]

LATE_BEGIN, LATE_END = 0.0, 0.75  # late stage: cut from the first step, reach S* at 3/4
EARLY_BEGIN, EARLY_END = 0.1, 0.75  # early stage: learn first, then shrink to the target


def size_bound(
    step: int,
    total: int,
    size0: float,
    target: float,
    *,
    begin: float = LATE_BEGIN,
    end: float = LATE_END,
) -> float:
    """``B(step)`` of the module docstring (``size0`` when ``total`` is 0)."""
    if not 0.0 <= begin < end <= 1.0:
        raise ValueError(f"need 0 <= begin < end <= 1, got begin={begin}, end={end}")
    if total <= 0 or size0 <= target:
        return float(min(size0, target)) if total > 0 else float(size0)
    start, stop = begin * total, end * total
    u = min(max((step - start) / max(stop - start, 1e-12), 0.0), 1.0)
    bound = target + (size0 - target) * (1.0 - u) ** 3
    return float(target) if math.isclose(u, 1.0) else float(bound)
