"""The custom ops trace under ``torch.compile(fullgraph=True)`` (torch path on the CPU): a
module using every op compiles without a graph break and matches eager, forward and
backward. ``aot_eager`` exercises the fake and autograd registrations without a C++ build."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.kernels.merge import merge_pair
from engine.kernels.skinny import skinny_mm, skinny_tmm, wide_mm
from engine.kernels.ttm_rows import ttm_rows


class _UsesEveryOp(nn.Module):
    """Embedding rows -> a merged two-core TT weight -> fused skinny products."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = nn.Parameter(torch.randn(4, 2, 3, generator=g))  # (N_L, M_L, r)
        self.bm = nn.Parameter(torch.randn(3, 3, 3, generator=g))  # (N_R, r, M_R)
        self.core1 = nn.Parameter(torch.randn(1, 1, 6, 2, generator=g))  # (G, 1, n, r)
        self.core2 = nn.Parameter(torch.randn(1, 2, 5, 1, generator=g))  # (G, r, m, 1)

    def forward(self, p: Tensor, q: Tensor) -> Tensor:
        rows = ttm_rows(self.a, self.bm, p, q, False)  # (U, 6)
        w = merge_pair(self.core1, self.core2, False).view(6, 5)  # (6, 5): rank-2 weight
        left = w[:, :2]  # (6, 2)
        t1 = skinny_mm(rows, left, "gelu", True, False)  # (U, 3)
        right = w[:3, 2:].contiguous()  # (3, 3)
        y = wide_mm(t1, right, None, "none", False)  # (U, 3)
        return y + skinny_tmm(rows, y, "none", False).sum()  # (U, 3)


def test_fullgraph_compile_matches_eager():
    torch._dynamo.reset()
    model = _UsesEveryOp()
    p, q = torch.tensor([0, 3, 3, 1]), torch.tensor([2, 2, 0, 1])
    eager = model(p, q)
    eager_grads = torch.autograd.grad(eager.square().sum(), list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(p, q)
    out_grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    torch.testing.assert_close(out, eager)
    for got, want in zip(out_grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want)
