"""comera::ttm_rows (the TTM lookup's per-row contraction) and the Triton lookup end to end,
against autograd of the float64 torch reference and the dense table."""

from __future__ import annotations

import math

import pytest
import torch

from engine.contract.reference import ttm_table
from engine.kernels.ttm_rows import ttm_rows, ttm_rows_backward, ttm_rows_reference
from engine.nn.ttm_embedding import TTMEmbedding
from tests.engine.kernels.conftest import DTYPES, opcheck_utils
from tests.helpers.assertions import assert_close_rel, grads

# (N_L, M_L, r, N_R, M_R, p, q): odd sizes, rank 1, U = 1, repeated sub-indices (atomics)
CASES = [
    pytest.param(5, 3, 4, 6, 5, [4, 0, 4, 2, 4, 1, 0], [5, 5, 0, 3, 1, 5, 2], id="odd"),
    pytest.param(4, 2, 1, 3, 3, [3, 0, 3], [2, 2, 1], id="rank1"),
    pytest.param(3, 5, 17, 2, 7, [1], [1], id="U1-r17"),
]


def _inputs(n_l, m_l, r, n_r, m_r, p, q, dtype, device):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n_l, m_l, r, generator=g).to(device, dtype)  # (N_L, M_L, r)
    bm = torch.randn(n_r, r, m_r, generator=g).to(device, dtype)  # (N_R, r, M_R)
    up = torch.randn(len(p), m_l * m_r, generator=g).to(device, dtype)  # (U, D)
    idx = [torch.tensor(v, device=device) for v in (p, q)]
    return a, bm, up, *idx


@pytest.mark.parametrize("dtype, tol", DTYPES)
@pytest.mark.parametrize("n_l, m_l, r, n_r, m_r, p, q", CASES)
def test_rows_and_gradients_match_float64_reference(
    n_l, m_l, r, n_r, m_r, p, q, dtype, tol, device
):
    a, bm, up, p, q = _inputs(n_l, m_l, r, n_r, m_r, p, q, dtype, device)
    a.requires_grad_(True)
    bm.requires_grad_(True)
    out = ttm_rows(a, bm, p, q, True)  # (U, M_L M_R)
    a64, bm64 = (t.detach().double().requires_grad_(True) for t in (a, bm))
    ref = ttm_rows_reference(a64, bm64, p, q)  # autograd of the reference in float64
    assert out.dtype == dtype and out.shape == ref.shape
    assert_close_rel(out.double(), ref, tol, "out")
    for name, got, want in zip(
        ("dA", "dBm"), grads(out, [a, bm], up), grads(ref, [a64, bm64], up.double()), strict=True
    ):
        assert got.dtype == dtype
        assert_close_rel(got.double(), want, tol, name)


def test_backward_op_is_the_reference_backward(device):
    """The scatter-add kernels against the explicit torch backward (many repeats)."""
    a, bm, up, p, q = _inputs(
        3, 2, 3, 2, 4, [0, 2, 2, 2, 1, 0], [1, 1, 0, 1, 1, 1], torch.float32, device
    )
    d_a, d_b = ttm_rows_backward(up, a, bm, p, q, True)
    r_a, r_b = ttm_rows_backward(up, a, bm, p, q, False)
    assert_close_rel(d_a, r_a, 1e-6, "dA")
    assert_close_rel(d_b, r_b, 1e-6, "dBm")


def test_autograd_registration_passes_gradcheck_in_float64():
    """The registered backward (torch path) against finite differences."""
    a, bm, _, p, q = _inputs(3, 2, 2, 2, 3, [0, 2, 0], [1, 1, 0], torch.float64, "cpu")
    a.requires_grad_(True)
    bm.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, y: ttm_rows(x, y, p, q, False), (a, bm))


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
def test_opcheck(use_triton, device):
    a, bm, up, p, q = _inputs(3, 2, 3, 2, 3, [0, 2, 2], [1, 1, 0], torch.float32, device)
    a.requires_grad_(True)
    torch.library.opcheck(ttm_rows, (a, bm, p, q, use_triton), test_utils=opcheck_utils(use_triton))
    torch.library.opcheck(
        ttm_rows_backward,
        (up, a.detach(), bm, p, q, use_triton),
        test_utils=opcheck_utils(use_triton, backward_op=True),
    )


def _embedding(rows, cols, ranks, dtype, device, dedup=True) -> TTMEmbedding:
    torch.manual_seed(0)
    v = math.prod(rows) - 1  # one padded row
    mod = TTMEmbedding(
        v,
        math.prod(cols),
        row_modes=rows,
        col_modes=cols,
        ranks=ranks,
        dedup=dedup,
        kernel="triton",
        device=device,
        dtype=dtype,
    )
    with torch.no_grad():  # live, negative and exactly-tau (dead) gate entries
        for gate in mod.gates:
            gate.uniform_(0.3, 1.5)
        mod.gates[0][0] = -0.5
        mod.gates[-1][-1] = mod.gate_threshold
    return mod


@pytest.mark.parametrize("dedup", [True, False], ids=["dedup", "nodedup"])
@pytest.mark.parametrize(
    "rows, cols, ranks",
    [((3, 2, 5), (2, 3, 1), (3, 2)), ((4, 5), (3, 2), (1,))],
    ids=["K3", "K2-rank1"],
)
def test_lookup_matches_dense_table_in_float64(rows, cols, ranks, dedup, device):
    """TTMEmbedding(kernel=TRITON), float32: output and every core/gate gradient against
    autograd through the dense float64 table."""
    mod = _embedding(rows, cols, ranks, torch.float32, device, dedup)
    ids = torch.tensor([[0, mod.num_embeddings - 1, 7, 7], [7, 0, 3, 7]], device=device)
    out = mod(ids)  # (2, 4, D)
    params64 = [p.detach().double().requires_grad_(True) for p in mod.parameters()]
    k = len(mod.cores)
    table = ttm_table(
        params64[:k], params64[k:], mod.gate_threshold, mod.num_embeddings, mod.embedding_dim
    )  # (V, D)
    ref = table[ids]  # (2, 4, D)
    assert_close_rel(out.double(), ref, 1e-5, "out")
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    names = [n for n, _ in mod.named_parameters()]
    got = grads(out, list(mod.parameters()), up)
    want = grads(ref, params64, up.double())
    for name, g, w in zip(names, got, want, strict=True):
        if float(w.abs().max()) == 0.0:  # a gate with no live path
            assert float(g.abs().max()) == 0.0, name
        else:
            assert_close_rel(g.double(), w, 1e-5, name)


def test_lookup_bfloat16_tracks_the_torch_path(device):
    """In bfloat16 the Triton lookup (float32 accumulation) is at least as close to the
    float64 table as the torch path (bfloat16 index_add)."""
    tri = _embedding((3, 2, 5), (2, 3, 1), (3, 2), torch.bfloat16, device)
    ids = torch.tensor([1, 4, 4, 28, 4, 0], device=device)
    params64 = [p.detach().double() for p in tri.parameters()]
    ref = ttm_table(
        params64[:3], params64[3:], tri.gate_threshold, tri.num_embeddings, tri.embedding_dim
    )[ids]
    out_tri = tri(ids).detach()
    tri.kernel = "torch"
    out_torch = tri(ids).detach()
    err_tri = float((out_tri.double() - ref).abs().max() / ref.abs().max())
    err_torch = float((out_torch.double() - ref).abs().max() / ref.abs().max())
    assert err_tri <= max(2 * err_torch, 1e-2), (err_tri, err_torch)
