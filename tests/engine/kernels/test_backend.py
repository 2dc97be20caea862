"""KernelPref parsing, the AUTO/TORCH/TRITON rule and its clear errors, and the wiring into
the TT layers (which ops a forward+backward really runs)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.kernels import backend
from engine.kernels.backend import (
    KernelPref,
    KernelUnavailableError,
    parse_kernel,
    resolve_backend,
)
from engine.kernels.skinny import skinny_mm
from engine.kernels.ttm_rows import ttm_rows
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding


class _OpLog(TorchDispatchMode):
    """Records the name of every op dispatched (custom ops included)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _run_linear(kernel: str, device: str = "cpu") -> tuple[list[torch.Tensor], list[str]]:
    torch.manual_seed(0)
    layer = TTLinear(
        12, 10, in_modes=(4, 3), out_modes=(2, 5), max_rank=3, kernel=kernel, device=device
    )
    x = torch.randn(5, 12, device=device, requires_grad=True)
    with _OpLog() as log:
        y = layer(x, "gelu")
        y.backward(torch.ones_like(y))
    return [y.detach(), x.grad, *(p.grad for p in layer.parameters())], log.names


def _run_embedding(kernel: str, device: str = "cpu") -> tuple[list[torch.Tensor], list[str]]:
    torch.manual_seed(0)
    emb = TTMEmbedding(
        30, 6, row_modes=(2, 3, 5), col_modes=(1, 2, 3), max_rank=3, kernel=kernel, device=device
    )
    with _OpLog() as log:
        out = emb(torch.tensor([[4, 29, 4], [0, 7, 29]], device=device))
        out.backward(torch.ones_like(out))
    return [out.detach(), *(p.grad for p in emb.parameters())], log.names


def test_parse_kernel_accepts_members_and_names_and_rejects_others():
    assert parse_kernel(KernelPref.TRITON) is KernelPref.TRITON
    assert parse_kernel("Torch") is KernelPref.TORCH
    assert parse_kernel("auto") is KernelPref.AUTO
    with pytest.raises(ValueError, match="kernel must be one of auto, torch, triton"):
        parse_kernel("cuda")
    with pytest.raises(ValueError, match="kernel must be one of"):
        TTLinear(8, 8, kernel="fast")


def test_auto_and_torch_pick_torch_on_cpu():
    cpu = torch.ones(2)
    assert resolve_backend(KernelPref.AUTO, cpu) == "torch"
    assert resolve_backend("torch", cpu) == "torch"
    assert resolve_backend("auto", cpu.double()) == "torch"


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(KernelUnavailableError, match="on the CPU and TRITON_INTERPRET=1 is not"):
        resolve_backend(KernelPref.TRITON, torch.ones(2))
    layer = TTLinear(12, 10, max_rank=2, kernel="triton")
    with pytest.raises(KernelUnavailableError, match="kernel=TRITON cannot run.*TRITON_INTERPRET"):
        layer(torch.randn(3, 12))
    emb = TTMEmbedding(30, 6, max_rank=2, kernel=KernelPref.TRITON)
    with pytest.raises(KernelUnavailableError, match="TRITON_INTERPRET=1"):
        emb(torch.tensor([1, 2]))
    a, bm, idx = torch.ones(3, 2, 2), torch.ones(3, 2, 2), torch.tensor([0, 2])
    with pytest.raises(KernelUnavailableError, match="comera::ttm_rows .*TRITON_INTERPRET"):
        ttm_rows(a, bm, idx, idx, True)


def test_triton_without_triton_installed_is_a_clear_error(monkeypatch):
    backend._triton_import_error.cache_clear()
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    try:
        with pytest.raises(KernelUnavailableError, match="triton cannot be imported.*pip install"):
            resolve_backend("triton", torch.ones(2))
        assert resolve_backend("auto", torch.ones(2)) == "torch"
    finally:
        monkeypatch.undo()
        backend._triton_import_error.cache_clear()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: [torch.ones(2, dtype=torch.float64, device=d)], "float64 is not supported"),
        (
            lambda d: [torch.ones(2, device=d), torch.ones(2, dtype=torch.bfloat16, device=d)],
            "mixed dtypes",
        ),
        (lambda d: [torch.ones(2, device="meta")], "on 'meta'"),
        (lambda d: [torch.ones(2, device=d), torch.ones(2, device="meta")], "several device"),
    ],
    ids=["float64", "mixed", "meta", "two-devices"],
)
def test_triton_on_unsupported_inputs_names_why(make, match, device):
    with pytest.raises(KernelUnavailableError, match=match):
        resolve_backend("triton", *make(device))
    assert resolve_backend("auto", *make(device)) == "torch"


def test_auto_on_cpu_runs_exactly_the_torch_ops():
    """AUTO on the CPU dispatches the same op sequence as TORCH and never a comera:: op."""
    for run in (_run_linear, _run_embedding):
        auto, auto_ops = run("auto")
        torch_, torch_ops = run("torch")
        assert auto_ops == torch_ops
        assert not [n for n in auto_ops if n.startswith("comera")]
        for a, t in zip(auto, torch_, strict=True):
            assert torch.equal(a, t)


def test_triton_runs_the_custom_ops(device):
    """With kernel=TRITON the layers go through the comera:: ops, forward and backward."""
    _, ops = _run_linear("triton", device)
    for name in ("skinny_mm", "wide_mm", "skinny_tmm", "merge_pair", "merge_pair_backward"):
        assert f"comera.{name}" in ops, name
    _, ops = _run_embedding("triton", device)
    for name in ("ttm_rows", "ttm_rows_backward", "merge_pair", "merge_pair_backward"):
        assert f"comera.{name}" in ops, name


def test_kernel_attribute_validates_and_shows_in_repr():
    layer = TTLinear(12, 10, max_rank=2)
    assert layer.kernel is KernelPref.AUTO and "kernel" not in layer.extra_repr()
    layer.kernel = "TRITON"
    assert layer.kernel is KernelPref.TRITON and "kernel=triton" in layer.extra_repr()
    assert layer.meta.kernel is KernelPref.TRITON
    emb = TTMEmbedding(30, 6, max_rank=2)
    with pytest.raises(ValueError, match="kernel must be one of"):
        emb.kernel = "gpu"


def test_cpu_kernels_run_whatever_imported_triton_first(device):
    """Triton's language was imported compiled (no TRITON_INTERPRET at import in this
    process, as in a whole-suite run); the CPU kernel still runs, through the interpreter."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    if device == "cpu":
        assert isinstance(tl.zeros, JITFunction)  # decorated without the interpreter
    x, w = torch.randn(5, 4, device=device), torch.randn(4, 3, device=device)
    got = skinny_mm(x, w, "gelu", True, True)  # (5, 4)
    want = torch.cat([torch.nn.functional.gelu(x) @ w, torch.ones(5, 1, device=device)], 1)
    torch.testing.assert_close(got, want)
