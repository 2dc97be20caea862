"""Mode factorization and rank bookkeeping for TT / TTM formats.

A dimension ``size`` is written as a product of ``d`` modes. Sizes with poor factorizations
(primes, ``30522``) are padded to a nearby size whose factorization is balanced; the padding
is reported so callers can show it. Ranks are always handled as the full vector
``(1, r_1, ..., r_{K-1}, 1)`` for a chain of ``K`` cores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "ModeFactorization",
    "factorize",
    "resolve_modes",
    "default_order",
    "bond_rank_bounds",
    "resolve_ranks",
]


@dataclass(frozen=True)
class ModeFactorization:
    """``size`` written as ``prod(modes) = padded_size >= size``."""

    size: int
    modes: tuple[int, ...]

    @property
    def padded_size(self) -> int:
        return math.prod(self.modes)

    @property
    def padding(self) -> int:
        return self.padded_size - self.size


def _check_positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@lru_cache(maxsize=4096)
def _min_sum_factors(n: int, d: int, smallest: int) -> tuple[int, ...] | None:
    """Factors ``a_1 <= ... <= a_d`` of ``n`` (each >= ``smallest``) with the least sum."""
    if d == 1:
        return (n,) if n >= smallest else None
    best: tuple[int, ...] | None = None
    a = smallest
    while a ** d <= n:
        if n % a == 0:
            rest = _min_sum_factors(n // a, d - 1, a)
            if rest is not None and (best is None or a + sum(rest) < sum(best)):
                best = (a, *rest)
        a += 1
    return best


def factorize(size: int, d: int, *, max_padding: float = 0.1) -> ModeFactorization:
    """Balanced ``d``-mode factorization of ``size`` (modes ascending), padding if it helps.

    The score of a padded size ``p`` is ``sum(modes) * p / size``: the sum of modes tracks the
    parameter count of a TT chain at fixed ranks, and ``p / size`` the wasted work. Candidates
    run from ``size`` to ``size * (1 + max_padding)`` and stop early once the AM-GM lower
    bound ``d * p**(1/d)`` cannot beat the best score.
    """
    _check_positive_int(size, "size")
    _check_positive_int(d, "d")
    if max_padding < 0:
        raise ValueError(f"max_padding must be >= 0, got {max_padding}")
    smallest = 2 if size >= 2**d else 1
    best: tuple[float, tuple[int, ...]] | None = None
    limit = size + max(int(size * max_padding), 0)
    for p in range(size, limit + 1):
        bound = d * p ** (1.0 / d) * p / size
        if best is not None and bound >= best[0]:
            break
        factors = _min_sum_factors(p, d, smallest)
        if factors is None:
            continue
        score = sum(factors) * p / size
        if best is None or score < best[0]:
            best = (score, factors)
    if best is None:  # no balanced factorization within the padding budget
        best = (0.0, _min_sum_factors(size, d, 1) or (size,) + (1,) * (d - 1))
    return ModeFactorization(size, tuple(best[1]))


def default_order(size: int) -> int:
    """Default number of modes for a dimension: 2 below 256, 3 below 16384, else 4."""
    if size < 256:
        return 2
    return 3 if size < 16384 else 4


def resolve_modes(
    size: int,
    modes: Sequence[int] | None,
    *,
    d: int | None = None,
    name: str = "modes",
    descending: bool = False,
) -> ModeFactorization:
    """Validate explicit ``modes`` for ``size`` or factorize automatically."""
    _check_positive_int(size, name.replace("modes", "size").strip("_") or "size")
    if modes is None:
        fact = factorize(size, d if d is not None else default_order(size))
        ordered = tuple(sorted(fact.modes, reverse=descending))
        return ModeFactorization(size, ordered)
    modes = tuple(modes)
    if len(modes) < 1:
        raise ValueError(f"{name} must not be empty")
    for m in modes:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"{name} must contain positive integers, got {modes}")
    if math.prod(modes) < size:
        raise ValueError(
            f"{name} {modes} multiply to {math.prod(modes)}, smaller than the size {size}"
        )
    return ModeFactorization(size, modes)


def bond_rank_bounds(mode_sizes: Sequence[int]) -> tuple[int, ...]:
    """Largest useful rank of each internal bond: min(prod of modes left, prod right)."""
    sizes = list(mode_sizes)
    return tuple(
        min(math.prod(sizes[: k + 1]), math.prod(sizes[k + 1 :])) for k in range(len(sizes) - 1)
    )


def resolve_ranks(
    mode_sizes: Sequence[int],
    *,
    max_rank: int | None,
    ranks: Sequence[int] | None = None,
    name: str = "ranks",
) -> tuple[int, ...]:
    """Full rank vector ``(1, r_1, ..., r_{K-1}, 1)`` for a chain with ``mode_sizes``.

    ``ranks`` may give the ``K - 1`` internal ranks or the full ``K + 1`` vector with ones at
    both ends. Without ``ranks`` every bond gets ``min(max_rank, bound)``.
    """
    k = len(mode_sizes)
    bounds = bond_rank_bounds(mode_sizes)
    if ranks is None:
        if max_rank is None:
            raise ValueError("max_rank is required when ranks is not given")
        _check_positive_int(max_rank, "max_rank")
        return (1, *(min(max_rank, b) for b in bounds), 1)
    ranks = tuple(ranks)
    if len(ranks) == k + 1:
        if ranks[0] != 1 or ranks[-1] != 1:
            raise ValueError(f"{name} given in full must start and end with 1, got {ranks}")
        inner = ranks[1:-1]
    elif len(ranks) == k - 1:
        inner = ranks
    else:
        raise ValueError(f"{name} must have {k - 1} internal or {k + 1} full entries, got {ranks}")
    for r in inner:
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"{name} must be integers >= 1, got {ranks}")
    if max_rank is not None:
        _check_positive_int(max_rank, "max_rank")
    return (1, *inner, 1)
