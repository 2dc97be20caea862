"""Dropout masks drawn fast on CPU, and dropout that keeps a one-byte mask for backward.

``y = x * m / (1 - p)`` with ``m ~ Bernoulli(1 - p)`` i.i.d. per element, as ``F.dropout``.
On CPU ``F.dropout`` draws a float mask with ``bernoulli_`` (two Mersenne-twister draws per
element, in one thread, ~6 ns each here), scales it, multiplies, and autograd keeps that
4-byte mask until backward. Here:

* :func:`dropout_mask` draws from numpy's PCG64, in fixed chunks of :data:`CHUNK` entries,
  each chunk its own stream ``SeedSequence((seed, chunk))``; from :data:`SPLIT_FROM` entries
  two threads draw half of the entries each (the fills release the GIL; a half that starts
  inside a chunk advances that chunk's stream to its first entry, so the split changes no
  entry). When ``1 - p`` is a multiple of 2^-16 to a relative 1e-4 (0.9 is 58982 /
  65536, off by 7e-6 relative), the mask is ``V < round(65536 (1 - p))`` with ``V`` a
  16-bit uniform, four per raw 64-bit draw (0.7 ns per entry here); otherwise ``U < 1 - p``
  with ``U`` a float32 uniform (24 random bits, 2.3 ns per entry). ``F.dropout`` takes ~4 ns
  (two Mersenne-twister draws per entry, one thread). ``seed`` is one draw from torch's
  default generator, so masks follow ``torch.manual_seed`` and ``torch.utils.checkpoint``
  (which restores that generator) recomputes the same mask; they do not depend on the
  thread count.
* :class:`DropoutFunction` saves it as ``bool``, a quarter of the memory of a float mask,
  and applies it read as ``uint8`` (the same bytes): ``x * m`` then ``* 1 / (1 - p)``, forward
  and backward. No float mask is made: a ``float * uint8`` product takes about 1.4x a
  ``float * float`` one here (0.22 vs 0.16 ms at 1024 x 768), ``float * bool`` 2.2x and the
  former ``where(m, dy * s, 0)`` 3.5x, and making the float mask cost as much as drawing it.
* :func:`dropout_add` is ``x + dropout(y)`` in one ``addcmul`` (the residual branches of a
  transformer block), the same arithmetic as the two ops.

Other devices keep ``F.dropout`` (fused kernels, one-byte masks already).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "CHUNK",
    "DropoutAddFunction",
    "as_bytes",
    "DropoutFunction",
    "dropout",
    "dropout_add",
    "dropout_mask",
    "keep_threshold16",
]

CHUNK = 1 << 18  # entries per random stream
SPLIT_FROM = 1 << 19  # masks of this many entries are drawn by two threads, half each
_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _helper() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dropout-rng")
        return _pool


def keep_threshold16(keep: float) -> int | None:
    """``round(65536 keep)`` when that is ``keep`` to a relative 1e-4 (a 16-bit draw then
    keeps with probability ``threshold / 65536``), else ``None``."""
    t = round(keep * 65536)
    if 0 < t < 65536 and abs(t / 65536 - keep) <= 1e-4 * keep:
        return t
    return None


def _fill(
    seed: int,
    start: int,
    stop: int,
    keep: float,
    mask: np.ndarray,
    scaled: np.ndarray | None,
    scale: float,
) -> None:
    """Draw ``mask[start:stop]`` (and ``scaled = scale * mask`` there) from the chunks' streams.

    ``start`` is a multiple of 4 (an entry boundary of a raw draw in both draws), so a range
    that starts inside a chunk advances that chunk's stream to it: the entries are those of
    the whole chunk drawn at once, however the work is split.
    """
    threshold = keep_threshold16(keep)
    per_draw = 4 if threshold is not None else 2  # 16-bit uniforms / float32s per raw draw
    for c in range(start // CHUNK, -(-stop // CHUNK)):
        lo, hi = max(start, c * CHUNK), min(stop, (c + 1) * CHUNK)
        bits = np.random.PCG64(np.random.SeedSequence((seed, c)))
        if lo > c * CHUNK:
            bits.advance((lo - c * CHUNK) // per_draw)
        if threshold is not None:  # four 16-bit uniforms per raw 64-bit draw
            v = bits.random_raw(-(-(hi - lo) // 4)).view(np.uint16)[: hi - lo]  # (hi - lo,)
            np.less(v, threshold, out=mask[lo:hi])
        else:
            u = np.random.Generator(bits).random(hi - lo, dtype=np.float32)  # uniform [0, 1)
            np.less(u, keep, out=mask[lo:hi])
        if scaled is not None:
            np.multiply(mask[lo:hi], scaled.dtype.type(scale), out=scaled[lo:hi])


def dropout_mask(
    shape: torch.Size | tuple[int, ...],
    keep: float,
    device: torch.device | str = "cpu",
    scale: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor | tuple[Tensor, Tensor]:
    """Bernoulli(``keep``) mask of ``shape`` as ``bool``; with ``scale`` also ``scale * m``
    in ``dtype`` (made in the same pass). Off the CPU: ``torch.rand(shape) < keep``."""
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if torch.device(device).type != "cpu" or (scale is not None and np_dtype is None):
        m = torch.rand(shape, device=device) < keep  # (shape) bool
        return m if scale is None else (m, (m * scale).to(dtype))
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))  # torch's generator decides
    n = int(np.prod(shape, dtype=np.int64))
    mask = np.empty(n, dtype=np.bool_)
    scaled = np.empty(n, dtype=np_dtype) if scale is not None else None
    if n >= SPLIT_FROM:  # the second half on the helper thread, the first here
        cut = n // 8 * 4
        job = _helper().submit(_fill, seed, cut, n, keep, mask, scaled, scale)
        _fill(seed, 0, cut, keep, mask, scaled, scale)
        job.result()
    else:
        _fill(seed, 0, n, keep, mask, scaled, scale)
    m = torch.from_numpy(mask).view(shape)  # (shape) bool
    return m if scaled is None else (m, torch.from_numpy(scaled).view(shape))


def as_bytes(mask: Tensor) -> Tensor:
    """A bool mask as ``uint8`` 0/1 (a view: the same bytes), the fast operand of a float
    product on CPU."""
    return mask.view(torch.uint8)


def _dropped(t: Tensor, mask: Tensor, scale: float) -> Tensor:
    """``t * m * scale``, ``m`` the bool mask read as bytes (module doc)."""
    return torch.mul(t, as_bytes(mask)).mul_(scale)


class DropoutFunction(torch.autograd.Function):
    """``x * m / keep`` for a fresh mask ``m``; saves only ``m`` (bool)."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        ctx.scale = 1.0 / (1.0 - p)
        mask = dropout_mask(x.shape, 1.0 - p, x.device)  # (x.shape) bool
        ctx.save_for_backward(mask)
        return _dropped(x, mask, ctx.scale)  # (x.shape)

    @staticmethod
    def backward(ctx, dy: Tensor):
        (mask,) = ctx.saved_tensors
        return _dropped(dy, mask, ctx.scale), None  # (x.shape)


class DropoutAddFunction(torch.autograd.Function):
    """``x + y * m / keep`` for a fresh mask ``m`` over ``y``; saves only ``m`` (bool)."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, p: float) -> Tensor:
        ctx.scale = 1.0 / (1.0 - p)
        mask = dropout_mask(y.shape, 1.0 - p, y.device)  # (y.shape) bool
        ctx.save_for_backward(mask)
        return torch.addcmul(x, y, as_bytes(mask), value=ctx.scale)  # (y.shape)

    @staticmethod
    def backward(ctx, dz: Tensor):
        (mask,) = ctx.saved_tensors
        return dz, _dropped(dz, mask, ctx.scale), None  # (y.shape) each


def _checked(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)`` with fast masks and a one-byte saved mask on CPU."""
    _checked(p)
    if not training or p == 0.0:
        return x
    if p == 1.0 or x.device.type != "cpu" or not x.is_floating_point():
        return F.dropout(x, p, True)
    return DropoutFunction.apply(x, p)


def dropout_add(x: Tensor, y: Tensor, p: float, training: bool = True) -> Tensor:
    """``x + dropout(y, p, training)`` (the same mask draw), fused on CPU when the two have one
    shape and dtype."""
    _checked(p)
    if not training or p == 0.0:
        return x + y
    fused = (
        p < 1.0
        and y.device.type == "cpu"
        and y.is_floating_point()
        and (x.shape == y.shape and x.dtype == y.dtype and x.device == y.device)
    )
    return DropoutAddFunction.apply(x, y, p) if fused else x + dropout(y, p, True)
