"""What the gated TT layers (:class:`engine.nn.tt_linear.TTLinear` and
:class:`engine.nn.ttm_embedding.TTMEmbedding`) share: the size check of their arguments and
the ``kernel`` attribute."""

from __future__ import annotations

from engine.kernels.backend import KernelPref, parse_kernel

__all__ = ["KernelChoice", "positive_int"]


def positive_int(value: object, name: str) -> int:
    """``value`` if it is an ``int`` >= 1 (``bool`` is not), else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class KernelChoice:
    """A layer's ``kernel``: torch ops or the Triton kernels (:class:`KernelPref`, set from a
    member or its name; :func:`engine.kernels.resolve_backend` decides what AUTO runs)."""

    _kernel: KernelPref

    @property
    def kernel(self) -> KernelPref:
        return self._kernel

    @kernel.setter
    def kernel(self, value: KernelPref | str) -> None:
        self._kernel = parse_kernel(value)
