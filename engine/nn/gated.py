"""What the gated TT layers (:class:`engine.nn.tt_linear.TTLinear` and
:class:`engine.nn.ttm_embedding.TTMEmbedding`) share: the size check of their arguments and
the ``kernel`` attribute."""

from __future__ import annotations

from engine.kernels.backend import KernelPref, parse_kernel
from engine.tt.shapes import positive_int

__all__ = ["KernelChoice", "positive_int"]


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
