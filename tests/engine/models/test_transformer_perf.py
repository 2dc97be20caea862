"""The training-step fast paths: lean dropout, lean attention, fused GELU -> TT-linear, recompute.

Each is checked against plain torch (float64, same random mask drawn from the same seed) for
outputs and every gradient, and for what it keeps for backward (saved-tensor hooks).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from engine.contract.plan import candidate_plans
from engine.models.transformer import TransformerConfig, build_transformer
from engine.nn.attention import AttentionFunction, scaled_dot_product_attention
from engine.nn.dropout import dropout, dropout_mask
from engine.nn.flat import flatten_
from engine.nn.tt_linear import TTLinear
from tests.helpers.assertions import assert_close_rel, grads


def saved_tensors(fn) -> list[torch.Tensor]:
    """Every tensor autograd saves while running ``fn()`` (returns them and fn's output)."""
    kept: list[torch.Tensor] = []

    def pack(t):
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return kept, out


# -- dropout --------------------------------------------------------------------------------
def test_dropout_matches_its_mask_and_saves_one_byte_per_entry():
    x = torch.randn(6, 50, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    kept, y = saved_tensors(lambda: dropout(x, 0.3))
    torch.manual_seed(3)
    m = dropout_mask(x.shape, 0.7, x.device)  # (6, 50) bool, the same draw
    assert m.dtype == torch.bool and 0 < int(m.sum()) < m.numel()
    assert_close_rel(y, x * m / 0.7, 1e-15, "dropout output")
    dy = torch.randn_like(y)
    (gx,) = grads(y, [x], dy)
    assert_close_rel(gx, dy * m / 0.7, 1e-15, "dropout gradient")
    assert [t.dtype for t in kept] == [torch.bool]


def test_dropout_keeps_the_stated_fraction():
    torch.manual_seed(0)
    n, keep = 400_000, 0.9
    frac = float(dropout_mask((n,), keep, torch.device("cpu")).float().mean())
    assert abs(frac - keep) < 5 * math.sqrt(keep * (1 - keep) / n)


def test_dropout_identity_cases_and_checks():
    x = torch.randn(4, 5)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(x, 1.5)


# -- attention ------------------------------------------------------------------------------
def reference_attention(q, k, v, keep, p, mask):
    """Plain float64 attention with an explicit dropout mask (B, H, S, T)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, S, T)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    prob = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows without a key -> 0, as SDPA
    if mask is not None:
        prob = prob * mask / (1 - p)
    return prob @ v  # (B, H, S, E)


def keep_masks(b, s, t):
    pad = torch.ones(b, 1, 1, t, dtype=torch.bool)
    pad[1, ..., t - 3:] = False  # key padding
    rows = torch.ones(b, 1, s, t, dtype=torch.bool)
    rows[0, 0, 2, :] = False  # a query with no key at all
    rows[1, 0, :, 0] = False
    return [None, pad, rows]


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_attention_matches_reference(case, p):
    torch.manual_seed(1)
    b, h, s, t, e = 2, 3, 5, 7, 4
    q = torch.randn(b, h, s, e, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, h, t, e, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, h, t, e, dtype=torch.float64, requires_grad=True)
    keep = keep_masks(b, s, t)[case]
    torch.manual_seed(7)
    y = AttentionFunction.apply(q, k, v, keep, p)
    torch.manual_seed(7)
    mask = dropout_mask((b * h, s, t), 1 - p, q.device).view(b, h, s, t) if p else None
    ref = reference_attention(q, k, v, keep, p, mask)
    assert_close_rel(y, ref, 1e-13, "attention output")
    dy = torch.randn_like(ref)
    for got, want, name in zip(grads(y, [q, k, v], dy), grads(ref, [q, k, v], dy), "qkv",
                               strict=True):  # fmt: skip
        assert_close_rel(got, want, 1e-12, f"d{name}")
    if p == 0.0:  # the no-dropout path is torch's own
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        assert_close_rel(scaled_dot_product_attention(q, k, v, keep), sdpa, 1e-15, "dispatch")


def test_attention_saves_probabilities_and_a_bool_mask_only():
    b, h, s, e = 2, 4, 16, 8
    q, k, v = (torch.randn(b, h, s, e, requires_grad=True) for _ in range(3))
    kept, _ = saved_tensors(lambda: scaled_dot_product_attention(q, k, v, None, 0.1))
    square = [t for t in kept if t.shape[-2:] == (s, s)]
    assert sorted(str(t.dtype) for t in square) == ["torch.bool", "torch.float32"]
    saved_bytes = sum(t.numel() * t.element_size() for t in kept)
    assert saved_bytes <= (3 * b * h * s * e + b * h * s * s) * 4 + b * h * s * s
    with pytest.raises(TypeError, match="bool"):
        scaled_dot_product_attention(q, k, v, torch.ones(b, 1, 1, s), 0.1)


# -- GELU fused into the TT-linear ------------------------------------------------------------
@pytest.mark.parametrize("plan", ["auto", "reference", *(str(p) for p in candidate_plans())])
def test_tt_linear_gelu_input_matches_gelu_then_linear(plan):
    torch.manual_seed(2)
    layer = TTLinear(24, 10, max_rank=3, in_modes=(4, 6), out_modes=(2, 5), plan=plan,
                     dtype=torch.float64)  # fmt: skip
    with torch.no_grad():
        layer.gates[1][0] = 0.0  # a masked gate entry
    x = torch.randn(9, 24, dtype=torch.float64, requires_grad=True)
    params = [x, *layer.parameters()]
    y = layer(x, activation="gelu")
    ref = layer(F.gelu(x))
    assert_close_rel(y, ref, 1e-13, f"{plan}: output")
    dy = torch.randn_like(ref)
    for i, (got, want) in enumerate(zip(grads(y, params, dy), grads(ref, params, dy),
                                        strict=True)):  # fmt: skip
        assert_close_rel(got, want, 1e-12, f"{plan}: gradient {i}")
    with pytest.raises(ValueError, match="activation"):
        layer(x, activation="relu")


def test_fused_gelu_keeps_the_pre_activation_not_a_second_tensor():
    layer = TTLinear(64, 32, max_rank=4, in_modes=(8, 8), out_modes=(4, 8), plan="ltr|rtl")
    x = torch.randn(128, 64, requires_grad=True)
    kept, _ = saved_tensors(lambda: layer(x, activation="gelu"))
    big = [t for t in kept if t.numel() >= x.numel()]
    assert len(big) == 1 and big[0].data_ptr() == x.data_ptr()  # x itself (a view)
    kept_plain, _ = saved_tensors(lambda: layer(F.gelu(x)))
    assert len([t for t in kept_plain if t.numel() >= x.numel()]) == 2  # x and gelu(x)


# -- recomputation and the model --------------------------------------------------------------
def run_step(cfg, tensorized, seed=0):
    torch.manual_seed(0)
    model = build_transformer(cfg, tensorized=tensorized, max_rank=4, shapes="auto").train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[2, 9:] = False
    torch.manual_seed(seed)  # the dropout masks
    logits = model(ids, torch.zeros_like(ids), mask)
    F.cross_entropy(logits, torch.tensor([0, 2, 1])).backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("tensorized", [False, True])
def test_recompute_gives_identical_outputs_and_gradients(tensorized):
    cfg = TransformerConfig.tiny()
    logits, g = run_step(cfg, tensorized)
    logits_r, g_r = run_step(cfg.replace(recompute=True), tensorized)
    assert torch.equal(logits, logits_r)
    assert g.keys() == g_r.keys()
    for name in g:
        assert torch.equal(g[name], g_r[name]), name
    other, _ = run_step(cfg, tensorized, seed=5)  # dropout is on: another seed differs
    assert not torch.equal(logits, other)


def test_recompute_keeps_only_block_inputs():
    cfg = TransformerConfig.tiny(n_layers=3)
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))

    def saved_bytes(recompute):
        model = build_transformer(cfg.replace(recompute=recompute), tensorized=True,
                                  max_rank=4, shapes="auto").train()  # fmt: skip
        kept, _ = saved_tensors(lambda: model(ids))
        return sum(t.numel() * t.element_size() for t in kept)

    assert saved_bytes(True) < saved_bytes(False) / 2


def test_recompute_is_validated_and_round_trips():
    cfg = TransformerConfig.tiny(recompute=True)
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="recompute"):
        TransformerConfig.tiny(recompute=1)


# -- flat parameter buffers -------------------------------------------------------------------
@pytest.mark.parametrize("fused", [False, True])
def test_flat_buffers_train_exactly_like_separate_parameters(fused):
    cfg = TransformerConfig.tiny(n_layers=1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=g)
    labels = torch.tensor([1, 0])
    models, opts, flats = [], [], []
    for flat in (False, True):
        torch.manual_seed(0)
        model = build_transformer(cfg, tensorized=True, max_rank=4, shapes="auto").train()
        params = list(model.parameters())
        if flat:
            flats = [flatten_(params[:7]), flatten_(params[7:])]
            params = [f.param for f in flats]
        opts.append(torch.optim.AdamW(params, lr=1e-2, fused=fused))
        models.append(model)
    for step in range(3):
        for model, opt in zip(models, opts, strict=True):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(step)
            F.cross_entropy(model(ids), labels).backward()
            if model is models[1]:
                for f in flats:
                    f.gather_grad_()
            opt.step()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        if fused:  # the fused kernel's vector / tail split differs: a rounding apart
            assert_close_rel(b, a, 1e-6, name)
        else:
            assert torch.equal(a, b), name
    assert all(f.intact() for f in flats)


def test_flatten_checks_and_gathers():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="device and dtype"):
        flatten_([a, b])
    with pytest.raises(ValueError, match="distinct"):
        flatten_([a, a])
    with pytest.raises(ValueError, match="at least one"):
        flatten_([])
    c = torch.nn.Parameter(torch.arange(6.0).view(2, 3))
    flat = flatten_([a, c])
    assert torch.equal(flat.param.data, torch.tensor([1.0, 1.0, 0, 1, 2, 3, 4, 5]))
    c.grad = torch.full((2, 3), 2.0)
    flat.gather_grad_()  # a has no gradient: zeros
    assert torch.equal(flat.param.grad, torch.tensor([0.0, 0, 2, 2, 2, 2, 2, 2]))
    with torch.no_grad():
        flat.param.add_(1.0)  # an optimizer writing the flat parameter writes the members
    assert torch.equal(c, torch.arange(1.0, 7.0).view(2, 3)) and flat.intact()
    c.data = torch.zeros(2, 3)  # replaced (as shrink_ does): no longer a view
    assert not flat.intact()
