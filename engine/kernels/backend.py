"""Kernel preference ``AUTO | TORCH | TRITON`` and the rule that turns it into a backend.

* ``TORCH``: the plain torch ops, everywhere.
* ``AUTO``: Triton when every tensor is on a CUDA device, ``triton`` imports, the tensors
  share one supported floating dtype and autocast is off; the torch ops otherwise, quietly
  (Liger's fallback rule). On the CPU, AUTO never touches ``triton``.
* ``TRITON``: Triton or a :class:`KernelUnavailableError` that says why not: ``triton`` does
  not import, the tensors are on the CPU without ``TRITON_INTERPRET=1`` (Triton runs CPU
  tensors only in its interpreter), another device, mixed or unsupported dtypes.

Triton (3.9) reads ``TRITON_INTERPRET`` when a ``@triton.jit`` decorator runs (its own
language functions are decorated when ``triton`` is imported). Our kernel does not depend on
that: :mod:`engine.kernels.triton_gemm` builds it explicitly, compiled for CUDA tensors and
interpreted for CPU tensors, whatever was imported first. Here ``TRITON_INTERPRET=1`` (read at
each call) is the opt-in for running CPU tensors through the interpreter, and while it is set
AUTO keeps CUDA tensors on torch (the interpreter would run them, slowly, on the host).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from enum import StrEnum
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "Backend",
    "KernelPref",
    "KernelUnavailableError",
    "SUPPORTED_DTYPES",
    "ensure_triton",
    "interpreter_requested",
    "parse_kernel",
    "resolve_backend",
    "triton_unavailable_reason",
]

Backend = Literal["torch", "triton"]
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class KernelPref(StrEnum):
    """Which implementation a TT layer's contractions use (see the module doc)."""

    AUTO = "auto"
    TORCH = "torch"
    TRITON = "triton"


class KernelUnavailableError(RuntimeError):
    """``kernel=TRITON`` was asked for where the Triton kernels cannot run."""


def parse_kernel(value: KernelPref | str) -> KernelPref:
    """``KernelPref`` from an enum member or its name/value, case-insensitive."""
    if isinstance(value, KernelPref):
        return value
    if isinstance(value, str) and value.lower() in {k.value for k in KernelPref}:
        return KernelPref(value.lower())
    choices = ", ".join(k.value for k in KernelPref)
    raise ValueError(f"kernel must be one of {choices}; got {value!r}")


def interpreter_requested() -> bool:
    """``TRITON_INTERPRET`` set to a true value, read as triton's ``knobs`` reads it."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


@functools.cache
def _triton_import_error() -> str | None:
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything else
        return (
            f"triton cannot be imported ({type(exc).__name__}: {exc}); install it with "
            "`pip install triton` (the [triton] extra)"
        )
    return None


def triton_unavailable_reason(tensors: Iterable[Tensor]) -> str | None:
    """Why the Triton kernels cannot run on ``tensors`` (floating ones), or None if they can."""
    if (error := _triton_import_error()) is not None:
        return error
    tensors = [t for t in tensors if t.is_floating_point()]
    devices = sorted({t.device.type for t in tensors})
    if len(devices) > 1:
        return f"the tensors are on several device types {devices}"
    device = devices[0] if devices else "cpu"
    if device == "cpu":
        if not interpreter_requested():
            return (
                "the tensors are on the CPU and TRITON_INTERPRET=1 is not set (Triton runs "
                "CPU tensors only in its interpreter)"
            )
    elif device != "cuda":
        return (
            f"the tensors are on {device!r}; Triton kernels run on CUDA tensors (or CPU "
            "tensors under TRITON_INTERPRET=1)"
        )
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        return f"the tensors have mixed dtypes {sorted(str(d) for d in dtypes)}"
    if dtypes and (dtype := dtypes.pop()) not in SUPPORTED_DTYPES:
        return f"dtype {dtype} is not supported (supported: {[str(d) for d in SUPPORTED_DTYPES]})"
    return None


def ensure_triton(tensors: Iterable[Tensor], what: str = "kernel=TRITON") -> None:
    """Raise :class:`KernelUnavailableError` naming why Triton cannot run on ``tensors``."""
    reason = triton_unavailable_reason(tensors)
    if reason is not None:
        raise KernelUnavailableError(f"{what} cannot run: {reason}")


def resolve_backend(pref: KernelPref | str, *tensors: Tensor) -> Backend:
    """The backend for ``pref`` on ``tensors`` (the module doc gives the rule)."""
    if not isinstance(pref, KernelPref):
        pref = parse_kernel(pref)
    if pref is KernelPref.TORCH:
        return "torch"
    if pref is KernelPref.AUTO:
        if not tensors or not all(t.is_cuda for t in tensors):  # CPU: torch, triton untouched
            return "torch"
        if torch.is_autocast_enabled("cuda"):  # the custom ops do not autocast
            return "torch"
        if interpreter_requested() or triton_unavailable_reason(tensors) is not None:
            return "torch"
        return "triton"
    ensure_triton(tensors)
    return "triton"
