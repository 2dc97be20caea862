"""Kernel tests: the Triton kernels against their torch references, on CPU tensors through
Triton's interpreter (and, where a GPU is present, compiled on CUDA tensors).

Triton 3.9 reads ``TRITON_INTERPRET`` when a ``@triton.jit`` decorator runs, and decorates its
own language functions when ``triton`` is imported, which in a whole-suite run happens long
before this folder (``torch.utils.flop_counter`` imports it). The kernel therefore does not use
the decorator: :mod:`engine.kernels.triton_gemm` wraps it explicitly, interpreted for CPU
tensors and compiled for CUDA tensors, whatever the import order, and ``TRITON_INTERPRET=1`` is
only the opt-in that lets CPU tensors through. It is set for each test here (and undone after
it), so nothing leaks into the rest of the suite.
"""

from __future__ import annotations

import pytest
import torch

from engine.kernels.backend import triton_unavailable_reason

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (dtype, max-norm relative tolerance against the float64 oracle)
DTYPES = [
    pytest.param(torch.float32, 1e-5, id="f32"),
    pytest.param(torch.bfloat16, 3e-2, id="bf16"),
]


@pytest.fixture(autouse=True)
def _interpret_cpu_tensors(monkeypatch):
    """``TRITON_INTERPRET=1`` for the duration of each test on a machine without CUDA."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> str:
    """The device the Triton kernels run on here; skips when they cannot run at all."""
    reason = triton_unavailable_reason([torch.empty(1, device=DEVICE)])
    if reason is not None:
        pytest.skip(f"Triton kernels cannot run in this process: {reason}")
    return DEVICE


def opcheck_utils(use_triton: bool, backward_op: bool = False) -> tuple[str, ...]:
    """``torch.library.opcheck`` tests. Schema (no mutation or aliasing) and fake tensor (the
    fake implementation's shapes, strides and dtype equal the real output) run the op for real,
    so they run on both paths. The traced ``test_aot_dispatch_dynamic`` sees only the fake and
    autograd registrations, which both paths share: it runs on the torch path of the forward
    ops, whose registered backwards call the backward ops (so those are traced there too)."""
    if use_triton or backward_op:
        return ("test_schema", "test_autograd_registration", "test_faketensor")
    return (
        "test_schema",
        "test_autograd_registration",
        "test_faketensor",
        "test_aot_dispatch_dynamic",
    )
