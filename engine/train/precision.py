"""Training precision: float32, or bfloat16 activations over float32 master weights.

``bf16`` wraps the forward in ``torch.autocast(device, dtype=torch.bfloat16)`` (CPU and CUDA
alike). Parameters, gradients and optimizer state stay float32: autocast casts weights per
op, and autograd hands gradients back in each parameter's own dtype. The engine's own autograd
functions follow suit: the fast path's products (:mod:`engine.contract.premerged`) run in
bfloat16 with their halves merged in float32 (:mod:`engine.contract.batched`), the TTM lookup
runs in float32 (its table rows are cheap), attention and dropout follow their inputs' dtype.
The loss comes out float32 (autocast runs ``cross_entropy`` in float32). Penalties, sizes and
the objective are computed outside the autocast region, in float32.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["PRECISION_DTYPES", "autocast"]

PRECISION_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The forward's precision context: autocast to ``precision`` (nothing for ``fp32``)."""
    if precision not in PRECISION_DTYPES:
        raise ValueError(f"precision must be one of {list(PRECISION_DTYPES)}, got {precision!r}")
    dtype = PRECISION_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
