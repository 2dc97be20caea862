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
  (two Mersenne-twister draws per entry, one thread). Outside a mask stream (below)
  ``seed`` is one draw from torch's default generator, so masks follow ``torch.manual_seed``
  and ``torch.utils.checkpoint`` (which restores that generator) recomputes the same mask;
  they do not depend on the thread count.
* :class:`DropoutFunction` saves it as ``bool``, a quarter of the memory of a float mask,
  and applies it read as ``uint8`` (the same bytes): ``x * m`` then ``* 1 / (1 - p)``, forward
  and backward. No float mask is made: a ``float * uint8`` product takes about 1.4x a
  ``float * float`` one here (0.22 vs 0.16 ms at 1024 x 768), ``float * bool`` 2.2x and the
  former ``where(m, dy * s, 0)`` 3.5x, and making the float mask cost as much as drawing it.
* :func:`dropout_add` is ``x + dropout(y)`` in one ``addcmul`` (the residual branches of a
  transformer block), the same arithmetic as the two ops.

**Masks of the global batch** (:func:`mask_stream`). The trainer runs each step's forward inside
``mask_stream(seed, step, rows)``: the ``i``-th mask of the step is then drawn from
``(seed, step, i)`` (not from torch's generator) as the mask of the *global* batch, and a
process holding rows ``[start, stop)`` of that batch (data parallel: its
``torch.tensor_split`` piece) draws only its slice: entries ``[start k, stop k)`` of the flat
global mask, ``k`` the entries per row. A masked tensor's dim 0 must be batch-major (``B``,
or ``B H`` for attention probabilities), which every built-in model's is. So every rank
draws exactly the masks the one-process run draws for its rows, whatever the world size, and
the streams' ``advance`` makes a slice cost only its own entries. A ``torch.utils.checkpoint``
recompute replays the block's masks through :func:`checkpoint_contexts`. Outside a stream
(a model used directly) the seed is one draw from torch's generator, as above.

Other devices keep ``F.dropout`` (fused kernels, one-byte masks already), with each process's
own generator: no stream there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "CHUNK",
    "DropoutAddFunction",
    "MaskStream",
    "active_stream",
    "checkpoint_contexts",
    "mask_stream",
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
    origin: int = 0,
) -> None:
    """Draw entries ``[start, stop)`` of the mask of stream ``seed`` into
    ``mask[start - origin : stop - origin]`` (and ``scaled = scale * mask`` there).

    A range that starts inside a chunk advances that chunk's stream to the raw draw holding
    ``start`` and drops the entries before it: the entries are those of the whole chunk drawn
    at once, however the work is split or sliced.
    """
    threshold = keep_threshold16(keep)
    per_draw = 4 if threshold is not None else 2  # 16-bit uniforms / float32s per raw draw
    for c in range(start // CHUNK, -(-stop // CHUNK)):
        lo, hi = max(start, c * CHUNK), min(stop, (c + 1) * CHUNK)
        bits = np.random.PCG64(np.random.SeedSequence((seed, c)))
        skip = (lo - c * CHUNK) % per_draw  # entries of the first raw draw before lo
        if lo - skip > c * CHUNK:
            bits.advance((lo - skip - c * CHUNK) // per_draw)
        n = hi - lo + skip
        out = mask[lo - origin : hi - origin]
        if threshold is not None:  # four 16-bit uniforms per raw 64-bit draw
            v = bits.random_raw(-(-n // 4)).view(np.uint16)[skip:n]  # (hi - lo,)
            np.less(v, threshold, out=out)
        else:
            u = np.random.Generator(bits).random(n, dtype=np.float32)[skip:]  # uniform [0, 1)
            np.less(u, keep, out=out)
        if scaled is not None:
            np.multiply(out, scaled.dtype.type(scale), out=scaled[lo - origin : hi - origin])


@dataclass
class MaskStream:
    """Where a step's masks come from: ``(seed, step, i)`` for its ``i``-th mask, of which
    this process draws rows ``[start, stop)`` of ``total`` (:func:`mask_stream`)."""

    seed: int
    step: int
    start: int
    stop: int
    total: int
    calls: int = 0

    def next_seed(self) -> int:
        """The stream seed of the next mask (and count it)."""
        entropy = np.random.SeedSequence((self.seed, self.step, self.calls))
        self.calls += 1
        return int(entropy.generate_state(1, np.uint64)[0] >> np.uint64(2))

    def origin(self, shape: torch.Size | tuple[int, ...], n: int) -> int:
        """The flat index in the global mask of this process's first entry of a mask of
        ``shape`` (``n`` entries, dim 0 batch-major)."""
        local = self.stop - self.start
        if local == self.total:
            return 0
        if not shape or shape[0] % local:
            raise ValueError(
                f"a dropout mask of shape {tuple(shape)} in a process holding {local} of "
                f"{self.total} rows: dim 0 must be batch-major (a multiple of {local})"
            )
        return self.start * (n // local)


_stream: MaskStream | None = None


def active_stream() -> MaskStream | None:
    """The stream the masks are drawn from now, or ``None`` (torch's generator)."""
    return _stream


@contextlib.contextmanager
def _installed(stream: MaskStream | None) -> Iterator[MaskStream | None]:
    global _stream
    before, _stream = _stream, stream
    try:
        yield stream
    finally:
        _stream = before


def mask_stream(
    seed: int, step: int, rows: tuple[int, int, int] | None = None
) -> contextlib.AbstractContextManager[MaskStream | None]:
    """Inside: CPU masks from ``(seed, step, i)``, the ``i``-th of the step, as the global
    batch's masks; ``rows = (start, stop, total)``: this process holds rows ``[start, stop)``
    of a global batch of ``total`` (default: all of them). ``seed`` in ``[0, 2^31)``."""
    start, stop, total = rows if rows is not None else (0, 1, 1)  # all of the rows
    return _installed(MaskStream(seed, step, start, stop, total))


def checkpoint_contexts() -> tuple[contextlib.AbstractContextManager, ...]:
    """``context_fn`` for ``torch.utils.checkpoint(..., use_reentrant=False)``: the
    recompute runs with the stream as the forward found it, so it draws the same masks."""
    at = None if _stream is None else replace(_stream)  # a copy: calls as before the block
    return contextlib.nullcontext(), _installed(at)


def dropout_mask(
    shape: torch.Size | tuple[int, ...],
    keep: float,
    device: torch.device | str = "cpu",
    scale: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor | tuple[Tensor, Tensor]:
    """Bernoulli(``keep``) mask of ``shape`` as ``bool``; with ``scale`` also ``scale * m``
    in ``dtype`` (made in the same pass). Inside :func:`mask_stream`, this process's rows of
    the global batch's mask (dim 0 of ``shape`` batch-major). Off the CPU:
    ``torch.rand(shape) < keep``."""
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if torch.device(device).type != "cpu" or (scale is not None and np_dtype is None):
        m = torch.rand(shape, device=device) < keep  # (shape) bool
        return m if scale is None else (m, (m * scale).to(dtype))
    n = int(np.prod(shape, dtype=np.int64))
    if _stream is None:
        seed, origin = int(torch.randint(0, 2**62, (), dtype=torch.int64)), 0  # torch's draw
    else:  # this process's rows of the global batch's mask
        seed, origin = _stream.next_seed(), _stream.origin(shape, n)
    mask = np.empty(n, dtype=np.bool_)
    scaled = np.empty(n, dtype=np_dtype) if scale is not None else None
    lo, hi = origin, origin + n  # the entries of the (global) mask drawn here
    if n >= SPLIT_FROM:  # the second half on the helper thread, the first here
        cut = lo + n // 2
        job = _helper().submit(_fill, seed, cut, hi, keep, mask, scaled, scale, origin)
        _fill(seed, lo, cut, keep, mask, scaled, scale, origin)
        job.result()
    else:
        _fill(seed, lo, hi, keep, mask, scaled, scale, origin)
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
