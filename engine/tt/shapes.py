"""Mode factorization and rank bookkeeping for TT / TTM formats.

A dimension ``size`` is written as a product of ``d`` modes. Sizes with poor factorizations
(primes, ``30522``) are padded to a nearby size whose factorization is balanced; the padding
is reported so callers can show it. Ranks are always handled as the full vector
``(1, r_1, ..., r_{K-1}, 1)`` for a chain of ``K`` cores.

Factorization search (``factorize`` states the selection rule). With ``S(p)`` the least sum of
``d`` ascending factors of ``p``, the integer ``V(p) = S(p) * p`` is the score times ``size``.
Narrow padding windows are scanned size by size: a segmented sieve factors the window and
each ``p`` is split by a depth-first search over its divisors, cut by AM-GM bounds. Wide
windows (millions of sizes for the DLRM tables) run a branch and bound over the factor tuples
themselves: a prefix with product ``q`` and sum ``s`` cannot finish below
``(s + m (lo / q)**(1/m)) * lo`` (AM-GM), which prunes all but a few hundred prefixes. The
sizes within ``1e-9`` of the best ``V`` then go through the scan's float comparisons, so the
result is exactly the scan's.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeGuard

__all__ = [
    "ModeFactorization",
    "factorize",
    "resolve_modes",
    "default_order",
    "bond_rank_bounds",
    "resolve_ranks",
    "positive_int",
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


def _is_positive_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def positive_int(value: object, name: str) -> int:
    """``value`` if it is an ``int`` >= 1 (``bool`` is not), else ``ValueError``."""
    if not _is_positive_int(value):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


_NARROW = 256  # windows of at most this many sizes are scanned size by size
_TIE_SLACK = 10**9  # sizes with V <= V* (1 + 1e-9) are replayed through the float comparisons
_BUDGET_PER_SIZE = 1  # branch-and-bound steps allowed per size in the window before scanning


def _iroot(n: int, k: int) -> int:
    """Exact ``floor(n ** (1 / k))`` for ``n >= 0``."""
    if n < 2 or k == 1:
        return n
    x = int(round(n ** (1.0 / k)))
    while x**k > n:
        x -= 1
    while (x + 1) ** k <= n:
        x += 1
    return x


@lru_cache(maxsize=8)
def _primes_below(n: int) -> tuple[int, ...]:
    """Primes ``< n`` (sieve of Eratosthenes); called with powers of two so few sieves exist."""
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, math.isqrt(n - 1) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytes(len(range(i * i, n, i)))
    return tuple(i for i, is_prime in enumerate(sieve) if is_prime)


def _window_factors(lo: int, hi: int) -> list[dict[int, int]]:
    """``{prime: exponent}`` of every integer in ``[lo, hi]`` (segmented sieve)."""
    rest = list(range(lo, hi + 1))
    facs: list[dict[int, int]] = [{} for _ in rest]
    root = math.isqrt(hi)
    for pr in _primes_below(1 << (root + 1).bit_length()):
        if pr > root:
            break
        for i in range(-lo % pr, len(rest), pr):
            e = 0
            while rest[i] % pr == 0:
                rest[i] //= pr
                e += 1
            facs[i][pr] = e
    for fac, r in zip(facs, rest, strict=True):
        if r > 1:
            fac[r] = 1
    return facs


def _best_split(
    n: int, fac: dict[int, int], d: int, smallest: int, cap: float
) -> tuple[int, ...] | None:
    """Least-sum ascending split of ``n`` (factored as ``fac``) into ``d`` factors ``>= smallest``.

    Returns the lexicographically smallest least-sum tuple (what a search over all integers in
    ascending order keeps) if its sum is ``<= cap``, else None. Depth-first over divisors,
    largest first (balanced splits come early); a prefix is cut once
    ``s + a + (m - 1) (rem / a)**(1 / (m - 1))`` (AM-GM on the rest) exceeds the best sum,
    a bound that only grows as ``a`` shrinks.
    """
    divs = [1]
    for pr, e in fac.items():
        divs = [x * pr**k for x in divs for k in range(e + 1)]
    divs.sort()
    best: list = [cap, None]  # [least sum allowed, tuple]

    def offer(total: int, split: tuple[int, ...]) -> None:
        if total < best[0] or (total == best[0] and (best[1] is None or split < best[1])):
            best[0], best[1] = total, split

    def visit(rem: int, m: int, a_min: int, s: int, prefix: tuple[int, ...]) -> None:
        if m == 1:
            if rem >= a_min:
                offer(s + rem, (*prefix, rem))
            return
        i = bisect.bisect_right(divs, _iroot(rem, m)) - 1
        while i >= 0 and divs[i] >= a_min:
            a = divs[i]
            i -= 1
            if rem % a:
                continue
            if m == 2:  # a + rem / a falls as a grows to sqrt(rem): the largest a is best
                offer(s + a + rem // a, (*prefix, a, rem // a))
                return
            if (s + a + (m - 1) * (rem / a) ** (1.0 / (m - 1))) * (1 - 1e-12) > best[0]:
                return
            visit(rem // a, m - 1, a, s + a, (*prefix, a))

    visit(n, d, smallest, 0, ())
    return best[1]


def _scan(size: int, d: int, limit: int, smallest: int) -> tuple[float, tuple[int, ...]] | None:
    """The reference linear scan over ``p`` (same float comparisons), with fast per-p splits."""
    best: tuple[float, tuple[int, ...]] | None = None
    facs: list[dict[int, int]] = []
    for p in range(size, limit + 1):
        bound = d * p ** (1.0 / d) * p / size
        if best is not None and bound >= best[0]:
            break
        if p - size == len(facs):  # factor the window in doubling blocks, as far as needed
            facs += _window_factors(p, min(p + max(len(facs), _NARROW) - 1, limit))
        fac = facs[p - size]
        if smallest > 1 and sum(fac.values()) < d:  # d factors >= 2 need d prime factors
            continue
        cap = math.inf if best is None else int(best[0] * size / p) + 2
        big = max(fac, default=1)  # some mode holds the largest prime factor
        if d > 1 and big**d > p and big + (d - 1) * (p / big) ** (1.0 / (d - 1)) > cap:
            continue
        factors = _best_split(p, fac, d, smallest, cap)
        if factors is None:
            continue
        score = sum(factors) * p / size
        if best is None or score < best[0]:
            best = (score, factors)
    return best


class _OverBudget(Exception):
    """The branch and bound visited more prefixes than the scan would have sizes to test."""


def _near_optimal(
    lo: int, hi: int, d: int, smallest: int, t_max: int, budget: list[int]
) -> tuple[int, dict[int, tuple[int, int, tuple[int, ...]]]] | None:
    """Branch and bound over ascending tuples with product in ``[lo, hi]`` and ``V <= t_max``.

    Returns ``(V*, {p: (V, sum, tuple)})`` holding every size whose best tuple has
    ``V <= V* (1 + 1e-9)`` (with its least sum, lexicographically smallest), or None.
    A prefix with product ``q``, sum ``s`` and ``m`` factors to go, each ``>= a``, completes to
    a product ``R >= max(lo / q, a**m)``, so ``V >= (s + a + (m-1) (R/a)**(1/(m-1))) q R``:
    below ``a = (lo/q)**(1/m)`` that bound falls as ``a`` grows and above it it rises, so each
    level walks outwards from there and stops at the first ``a`` past the limit.
    """
    state = {"limit": t_max, "best": None}
    found: dict[int, tuple[int, int, tuple[int, ...]]] = {}

    def record(p: int, total: int, split: tuple[int, ...]) -> None:
        v = total * p
        if state["best"] is None or v < state["best"]:
            state["best"] = v
            state["limit"] = min(t_max, v + v // _TIE_SLACK + 1)
        old = found.get(p)
        if old is None or (v, split) < (old[0], old[2]):
            found[p] = (v, total, split)

    def visit(m: int, q: int, s: int, a_min: int, prefix: tuple[int, ...]) -> None:
        r_lo, r_hi = -(-lo // q), hi // q
        if m == 1:  # only for d == 1; V = (s + a) q a rises with a
            for a in range(max(a_min, r_lo), r_hi + 1):
                if (s + a) * q * a > state["limit"]:
                    break
                record(q * a, s + a, (*prefix, a))
            return
        pivot, top, inv = _iroot(r_lo, m), _iroot(r_hi, m), 1.0 / (m - 1)
        for run in (range(min(pivot, top), a_min - 1, -1), range(max(pivot + 1, a_min), top + 1)):
            for a in run:
                budget[0] -= 1
                if a <= pivot:
                    lb = (s + a + (m - 1) * (r_lo / a) ** inv) * q * r_lo * (1 - 1e-12)
                else:
                    lb = (s + m * a) * q * a**m
                if lb > state["limit"]:
                    break
                if m > 2:
                    visit(m - 1, q * a, s + a, a, (*prefix, a))
                    continue
                b = max(a, -(-r_lo // a))  # last mode: V = (s + a + b) q a b rises with b
                while a * b <= r_hi and (s + a + b) * q * a * b <= state["limit"]:
                    record(q * a * b, s + a + b, (*prefix, a, b))
                    b += 1
            if budget[0] < 0:
                raise _OverBudget

    visit(d, 1, 0, smallest, ())
    best = state["best"]
    if best is None:
        return None
    tie = best + best // _TIE_SLACK + 1
    return best, {p: entry for p, entry in found.items() if entry[0] <= tie}


def _search_window(
    size: int, d: int, limit: int, smallest: int
) -> tuple[float, tuple[int, ...]] | None:
    """Wide windows: grow the limit on V from the AM-GM floor until a tuple fits, then replay."""
    v_floor = d * size ** (1.0 / d) * size
    v_all = (limit + d) * limit  # every tuple has V below this
    budget = [_BUDGET_PER_SIZE * (limit - size + 1)]
    slack = 1e-5
    try:
        while True:
            t_max = min(int(v_floor * (1 + slack)) + 1, v_all)
            hit = _near_optimal(size, limit, d, smallest, t_max, budget)
            if hit is not None:
                tie = hit[0] + hit[0] // _TIE_SLACK + 1
                if tie > t_max and t_max < v_all:  # the tie band pokes above this pass: redo
                    hit = _near_optimal(size, limit, d, smallest, min(tie, v_all), budget)
                break
            if t_max >= v_all:
                return None
            slack *= 8
    except _OverBudget:  # sparse candidates (a narrow window, many modes): scan instead
        return _scan(size, d, limit, smallest)
    best: tuple[float, tuple[int, ...]] | None = None
    for p in sorted(hit[1]):  # the scan's float comparisons on the sizes that can matter
        if best is not None and d * p ** (1.0 / d) * p / size >= best[0]:
            break
        _, total, split = hit[1][p]
        score = total * p / size
        if best is None or score < best[0]:
            best = (score, split)
    return best


def factorize(size: int, d: int, *, max_padding: float = 0.1) -> ModeFactorization:
    """Balanced ``d``-mode factorization of ``size`` (modes ascending), padding if it helps.

    Selection rule. Candidates are the padded sizes ``p`` in ``[size, size + int(size *
    max_padding)]``. ``S(p)`` is the least sum of ``d`` ascending factors of ``p``, each
    ``>= 2`` when ``size >= 2**d`` (else ``>= 1``), and the score is ``S(p) * p / size``: the
    sum of modes tracks the parameter count of a TT chain at fixed ranks, and ``p / size`` the
    wasted work. The result is the lowest score, ties to the smallest ``p``, and among the
    least-sum splits of that ``p`` the lexicographically smallest. Scores are compared as
    floats in increasing ``p``, stopping once the AM-GM bound ``d * p**(1/d) * p / size``
    reaches the best score, as the original exhaustive scan did (the results are identical;
    ``tests/engine/tt/test_shapes.py`` keeps that scan as the reference).
    If no candidate has such a split (primes with ``max_padding=0``), ``size`` itself is split
    with factors ``>= 1``.

    Windows of at most 256 sizes run that scan with fast per-size splits; wider ones run a
    branch and bound over factor tuples (module docstring), falling back to the scan when it
    takes more steps than the window has sizes. Sizes up to ``2**31`` take milliseconds.
    """
    positive_int(size, "size")
    positive_int(d, "d")
    if max_padding < 0:
        raise ValueError(f"max_padding must be >= 0, got {max_padding}")
    smallest = 2 if size >= 2**d else 1
    limit = size + max(int(size * max_padding), 0)
    if limit - size < _NARROW:
        best = _scan(size, d, limit, smallest)
    else:
        best = _search_window(size, d, limit, smallest)
    if best is None:  # no balanced factorization within the padding budget
        return ModeFactorization(
            size, _best_split(size, _window_factors(size, size)[0], d, 1, math.inf)
        )
    return ModeFactorization(size, best[1])


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
    positive_int(size, name.replace("modes", "size").strip("_") or "size")
    if modes is None:
        fact = factorize(size, d if d is not None else default_order(size))
        ordered = tuple(sorted(fact.modes, reverse=descending))
        return ModeFactorization(size, ordered)
    modes = tuple(modes)
    if len(modes) < 1:
        raise ValueError(f"{name} must not be empty")
    if not all(_is_positive_int(m) for m in modes):
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
        positive_int(max_rank, "max_rank")
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
    if not all(_is_positive_int(r) for r in inner):
        raise ValueError(f"{name} must be integers >= 1, got {ranks}")
    if max_rank is not None:
        positive_int(max_rank, "max_rank")
    return (1, *inner, 1)
