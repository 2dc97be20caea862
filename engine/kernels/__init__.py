"""Triton kernels for the small TT contractions, each a ``torch.library`` custom op with a
plain torch reference, chosen by a :class:`KernelPref` (``AUTO | TORCH | TRITON``).

* :mod:`engine.kernels.ttm_rows`: the TTM lookup's per-unique-row contraction and its
  scatter-add backward (``comera::ttm_rows``, ``comera::ttm_rows_backward``);
* :mod:`engine.kernels.merge`: merging two adjacent cores over a batch of chains
  (``comera::merge_pair``, ``comera::merge_pair_backward``) and the chain merges on top;
* :mod:`engine.kernels.skinny`: the TT-linear's fused skinny products (``comera::skinny_mm``,
  ``comera::wide_mm``, ``comera::skinny_tmm``);
* :mod:`engine.kernels.triton_gemm`: the one Triton kernel behind all of them, imported only
  on the first Triton launch (so this package imports without triton);
* :mod:`engine.kernels.backend`: the preference and the fallback rule.

Every op takes ``use_triton: bool`` last: ``False`` runs the torch reference (the ops trace
under ``torch.compile(fullgraph=True)`` on any device), ``True`` the Triton kernel.
"""

from engine.kernels import merge, skinny, ttm_rows
from engine.kernels.backend import (
    Backend,
    KernelPref,
    KernelUnavailableError,
    ensure_triton,
    parse_kernel,
    resolve_backend,
    triton_unavailable_reason,
)

__all__ = [
    "Backend",
    "KernelPref",
    "KernelUnavailableError",
    "ensure_triton",
    "merge",
    "parse_kernel",
    "resolve_backend",
    "skinny",
    "triton_unavailable_reason",
    "ttm_rows",
]
