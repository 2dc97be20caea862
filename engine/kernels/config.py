"""Launch configurations of the strided GEMM kernel, generated from the problem shape.

Every contraction here is small in at least one dimension (a TT rank), so the tiles are the
next power of two of each size, clamped to ``[16, 64]`` (16 is ``tl.dot``'s minimum). When the
grid is too small to fill the GPU and the reduction is long (``dL = x^T u`` over a batch of
rows, ``dG = P^T dP`` over a merged chain), the reduction is split over ``split_k`` programs
that accumulate with atomic adds into a float32 buffer (the launcher zeroes it first).

Escape hatch: ``COMERA_TRITON_GEMM_CONFIG="BM,BN,BK[,WARPS[,STAGES[,SPLIT_K]]]"`` pins one
configuration for every launch (tuning runs, bisecting a miscompile).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ENV_PIN", "TARGET_PROGRAMS", "GemmConfig", "gemm_config", "next_pow2"]

ENV_PIN = "COMERA_TRITON_GEMM_CONFIG"
# two waves of programs on a 132-SM H100/H200: below this a long reduction is split
TARGET_PROGRAMS = 264
_MIN_BLOCK, _MAX_BLOCK = 16, 64


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes (powers of two >= 16), warps, pipeline stages and the reduction split."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2
    split_k: int = 1

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < _MIN_BLOCK or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= {_MIN_BLOCK}, got {v}")
        if self.num_warps < 1 or self.num_warps & (self.num_warps - 1):
            raise ValueError(f"num_warps must be a power of two, got {self.num_warps}")
        if self.num_stages < 1 or self.split_k < 1:
            raise ValueError(f"num_stages and split_k must be >= 1, got {self}")


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _clamp(x: int) -> int:
    return min(_MAX_BLOCK, max(_MIN_BLOCK, next_pow2(x)))


def _pinned() -> GemmConfig | None:
    raw = os.environ.get(ENV_PIN, "").strip()
    if not raw:
        return None
    try:
        values = [int(v) for v in raw.split(",")]
        if not 3 <= len(values) <= 6:
            raise ValueError("expected 3 to 6 integers")
        return GemmConfig(*values)
    except ValueError as exc:
        msg = f"{ENV_PIN}={raw!r} is not BM,BN,BK[,WARPS[,STAGES[,SPLIT_K]]]: {exc}"
        raise ValueError(msg) from None


def gemm_config(batch: int, m: int, n: int, k: int, *, allow_split: bool) -> GemmConfig:
    """Configuration for ``batch`` products ``(m, k) @ (k, n)``; ``split_k > 1`` only when
    ``allow_split`` (the output is a float32 buffer accumulated atomically)."""
    pinned = _pinned()
    if pinned is not None:
        return pinned if allow_split else GemmConfig(**{**pinned.__dict__, "split_k": 1})
    bm, bn, bk = _clamp(m), _clamp(n), _clamp(k)
    split = 1
    if allow_split:
        tiles = max(1, batch * -(-m // bm) * -(-n // bn))
        if tiles < TARGET_PROGRAMS:
            # at least four K blocks per program, and no more programs than needed
            split = max(1, min(-(-k // (4 * bk)), -(-TARGET_PROGRAMS // tiles)))
    return GemmConfig(bm, bn, bk, num_warps=4, num_stages=2, split_k=split)
