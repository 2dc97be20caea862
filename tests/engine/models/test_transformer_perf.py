"""The training-step fast paths: lean dropout, lean attention, fused GELU -> TT-linear, recompute.

Each is checked against plain torch (float64, same random mask drawn from the same seed) for
outputs and every gradient, and for what it keeps for backward (saved-tensor hooks).
"""

from __future__ import annotations

import contextlib
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import engine.contract.ffn as ffn
from engine.contract.lowrank_saved import recompute_tt_outputs
from engine.contract.plan import candidate_plans
from engine.models.tensorize import TensorizeOptions
from engine.models.transformer import TransformerConfig, build_transformer
from engine.nn.attention import AttentionFunction, scaled_dot_product_attention
from engine.nn.dropout import CHUNK, dropout, dropout_mask, keep_threshold16
from engine.nn.feed_forward import tt_feed_forward
from engine.nn.flat import flatten_
from engine.nn.functional import parse_plan
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


@pytest.mark.parametrize(
    ("keep", "threshold"),
    [
        (0.9, 58982),
        (0.5, 32768),
        (0.8, 52429),
        (0.75, 49152),
        (0.3333, 21843),
        (0.99999, 65535),
        (0.01, None),
        (0.001, None),
        (1e-6, None),
    ],
)
def test_sixteen_bit_masks_only_where_they_keep_the_stated_fraction(keep, threshold):
    assert keep_threshold16(keep) == threshold
    if threshold is not None:
        assert abs(threshold / 65536 - keep) <= 1e-4 * keep


@pytest.mark.parametrize("keep", [0.9, 0.01])  # the 16-bit draw and the float32 one
def test_both_mask_draws_keep_their_fraction_and_follow_the_seed(keep):
    n = CHUNK + 1000
    torch.manual_seed(11)
    a = dropout_mask((n,), keep)
    torch.manual_seed(11)
    assert torch.equal(a, dropout_mask((n,), keep))
    want = keep_threshold16(keep) / 65536 if keep_threshold16(keep) else keep
    frac = float(a.float().mean())
    assert abs(frac - want) < 5 * math.sqrt(want * (1 - want) / n)


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
    pad[1, ..., t - 3 :] = False  # key padding
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
    for got, want, name in zip(
        grads(y, [q, k, v], dy), grads(ref, [q, k, v], dy), "qkv", strict=True
    ):
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
    layer = TTLinear(
        24, 10, max_rank=3, in_modes=(4, 6), out_modes=(2, 5), plan=plan, dtype=torch.float64
    )
    with torch.no_grad():
        layer.gates[1][0] = 0.0  # a masked gate entry
    x = torch.randn(9, 24, dtype=torch.float64, requires_grad=True)
    params = [x, *layer.parameters()]
    y = layer(x, activation="gelu")
    ref = layer(F.gelu(x))
    assert_close_rel(y, ref, 1e-13, f"{plan}: output")
    dy = torch.randn_like(ref)
    for i, (got, want) in enumerate(zip(grads(y, params, dy), grads(ref, params, dy), strict=True)):
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
    model = build_transformer(
        cfg, tensorized=tensorized, options=TensorizeOptions(max_rank=4)
    ).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[2, 9:] = False
    torch.manual_seed(seed)  # the dropout masks
    logits = model(ids, torch.zeros_like(ids), mask)
    F.cross_entropy(logits, torch.tensor([0, 2, 1])).backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def same_logits(tensorized: bool, **change) -> tuple[torch.Tensor, dict, dict]:
    """``run_step`` of the tiny config, then of it with ``change``: the logits must be equal;
    the logits and both runs' gradients."""
    cfg = TransformerConfig.tiny()
    logits, g = run_step(cfg, tensorized)
    logits_r, g_r = run_step(cfg.replace(**change), tensorized)
    assert torch.equal(logits, logits_r)
    assert g.keys() == g_r.keys()
    return logits, g, g_r


@pytest.mark.parametrize("tensorized", [False, True])
def test_recompute_gives_identical_outputs_and_gradients(tensorized):
    logits, g, g_r = same_logits(tensorized, recompute=True)
    for name in g:
        assert torch.equal(g[name], g_r[name]), name
    # dropout is on: another seed differs
    other, _ = run_step(TransformerConfig.tiny(), tensorized, seed=5)
    assert not torch.equal(logits, other)


def test_recompute_keeps_only_block_inputs():
    cfg = TransformerConfig.tiny(n_layers=3)
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))

    def saved_bytes(recompute):
        model = build_transformer(
            cfg.replace(recompute=recompute), tensorized=True, options=TensorizeOptions(max_rank=4)
        ).train()
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
        model = build_transformer(
            cfg, tensorized=True, options=TensorizeOptions(max_rank=4)
        ).train()
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
        if fused and name.endswith("attn.k.bias"):
            # softmax ignores a bias shared by every key: its gradient is rounding noise, which
            # Adam normalizes to steps of ~lr, so one rounding apart becomes ~1e-4 apart
            assert_close_rel(b, a, 1e-2, name)
        elif fused:  # the fused kernel's vector / tail split differs: a rounding apart
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
    a.grad = torch.ones(2)
    flat.zero_grad_()  # frees the members' gradients and the gathered one
    assert a.grad is None and c.grad is None and flat.param.grad is None
    c.data = torch.zeros(2, 3)  # replaced (as shrink_ does): no longer a view
    assert not flat.intact()


def test_dropout_mask_is_chunked_deterministic_and_seeded():
    n = 2 * CHUNK + 123  # three streams, two threads
    torch.manual_seed(4)
    a = dropout_mask((n,), 0.8)
    torch.manual_seed(4)
    b, scaled = dropout_mask((n,), 0.8, scale=1.25)
    assert torch.equal(a, b) and torch.equal(scaled, b.float() * 1.25)
    torch.manual_seed(5)
    assert not torch.equal(a, dropout_mask((n,), 0.8))
    chunk_means = [float(a[i * CHUNK : (i + 1) * CHUNK].float().mean()) for i in range(2)]
    assert all(abs(m - 0.8) < 5 * math.sqrt(0.16 / CHUNK) for m in chunk_means)
    assert not torch.equal(a[:CHUNK], a[CHUNK : 2 * CHUNK])  # independent streams


# -- the fused TT feed-forward block ----------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("block", [4, 1000])
def test_tt_feed_forward_matches_the_layers(bias, block, monkeypatch):
    monkeypatch.setattr(ffn, "BLOCK_ELEMENTS", block * 36)  # 4 rows: several row blocks
    torch.manual_seed(0)
    fc1 = TTLinear(
        19, 35, bias=bias, max_rank=3, in_modes=(4, 5), out_modes=(6, 6), dtype=torch.float64
    )  # padded: 20 > 19 inputs, 36 > 35 hidden
    fc2 = TTLinear(
        35, 14, bias=bias, max_rank=3, in_modes=(6, 6), out_modes=(2, 7), dtype=torch.float64
    )
    with torch.no_grad():
        fc1.gates[1][0] = 0.0  # masked entries on both layers
        fc2.gates[0][2] = -0.5
    x = torch.randn(2, 5, 19, dtype=torch.float64, requires_grad=True)
    y = tt_feed_forward(x, fc1, fc2)
    ref = fc2(F.gelu(fc1(x)))
    assert_close_rel(y, ref, 1e-13, "output")
    params = [x, *fc1.parameters(), *fc2.parameters()]
    dy = torch.randn_like(ref)
    for i, (got, want) in enumerate(zip(grads(y, params, dy), grads(ref, params, dy), strict=True)):
        assert_close_rel(got, want, 1e-12, f"gradient {i}")


def node_below_view(y) -> str:
    node = y.grad_fn
    while node.name().startswith(("View", "Reshape")):
        node = node.next_functions[0][0]
    return node.name()


def test_tt_feed_forward_keeps_no_hidden_sized_tensor_and_falls_back():
    fc1 = TTLinear(32, 256, max_rank=4, in_modes=(4, 8), out_modes=(16, 16))
    fc2 = TTLinear(256, 32, max_rank=4, in_modes=(16, 16), out_modes=(4, 8))
    x = torch.randn(64, 32, requires_grad=True)
    kept, y = saved_tensors(lambda: tt_feed_forward(x, fc1, fc2))
    assert max(t.numel() for t in kept) <= x.numel()  # x, [x L1, 1], [gelu(h) L2, 1]
    assert "TTFFN" in node_below_view(y)
    fc2.plan = parse_plan("reference")  # not a fused plan: the two layers, GELU fused in fc2
    y2 = tt_feed_forward(x, fc1, fc2)
    assert "TTFFN" not in node_below_view(y2)
    assert_close_rel(y2, y, 1e-5, "fallback")
    with pytest.raises(ValueError, match="fc1.out_features=256 != fc2.in_features=32"):
        tt_feed_forward(x, fc1, fc1)
    with pytest.raises(ValueError, match="last dimension must be 256"):
        tt_feed_forward(x, fc2, fc1)


# -- TT-linear outputs kept as factors -----------------------------------------------------------
def test_recompute_tt_outputs_rebuilds_views_exactly():
    torch.manual_seed(0)
    layer = TTLinear(24, 36, max_rank=3, in_modes=(4, 6), out_modes=(6, 6))
    x = torch.randn(10, 24, requires_grad=True)
    dy = torch.randn(6, 10, 6)

    def run(ctx):
        with ctx:
            y = layer(x).view(10, 6, 6).transpose(0, 1)  # a strided view of the output
            out = y * y  # saves y (twice)
        return out, grads(out, [x, *layer.parameters()], dy)

    out, g = run(contextlib.nullcontext())
    kept, (out_r, g_r) = saved_tensors(lambda: run(recompute_tt_outputs()))
    assert torch.equal(out, out_r)
    for a, b in zip(g, g_r, strict=True):
        assert_close_rel(b, a, 1e-6, "gradient")
    assert all(t.numel() < 10 * 36 for t in kept)  # nothing of y's size left for backward


@pytest.mark.parametrize("tensorized", [False, True])
def test_recompute_tt_outputs_in_the_model_gives_the_same_gradients(tensorized):
    _, g, g_r = same_logits(tensorized, recompute_tt_outputs=True)
    for name in g:
        assert_close_rel(g_r[name], g[name], 1e-5, name)


def _attention_case():
    """q, k, v (leaves), a key mask and an upstream gradient, float64, B 2, H 3, S 6, E 4."""
    torch.manual_seed(1)
    b, h, s, e = 2, 3, 6, 4
    q, k, v = (torch.randn(b, h, s, e, dtype=torch.float64, requires_grad=True) for _ in range(3))
    return q, k, v, keep_masks(b, s, s)[2], torch.randn(b, h, s, e, dtype=torch.float64)


def test_attention_rebuilds_probabilities_when_recomputing():
    q, k, v, keep, dy = _attention_case()
    s = q.shape[2]
    outs = []
    for ctx in (contextlib.nullcontext(), recompute_tt_outputs()):
        torch.manual_seed(9)
        with ctx:
            kept, y = saved_tensors(lambda: AttentionFunction.apply(q, k, v, keep, 0.3))
        outs.append((y, grads(y, [q, k, v], dy), kept))
    (y, g, _), (y_r, g_r, kept_r) = outs
    assert torch.equal(y, y_r)
    for a, c in zip(g, g_r, strict=True):
        assert_close_rel(c, a, 1e-13, "gradient")
    assert not [t for t in kept_r if t.dtype == q.dtype and t.shape[-2:] == (s, s)]


def test_attention_can_keep_its_probabilities_when_recomputing():
    q, k, v, keep, dy = _attention_case()
    b, h, s, _ = q.shape
    outs = []
    for keep_probs in (False, True):
        torch.manual_seed(9)
        with recompute_tt_outputs():
            kept, y = saved_tensors(
                partial(AttentionFunction.apply, q, k, v, keep, 0.3, keep_probs)
            )
        outs.append((y, grads(y, [q, k, v], dy), kept))
    (y, g, _), (y_k, g_k, kept_k) = outs
    assert torch.equal(y, y_k)
    for a, c in zip(g, g_k, strict=True):
        assert torch.equal(c, a)  # the same P, saved instead of rebuilt
    probs = [t for t in kept_k if t.dtype == q.dtype and t.shape[-2:] == (s, s)]
    assert len(probs) == 1 and probs[0].shape == (b * h, s, s)


def test_recompute_attention_flag_in_the_model_gives_the_same_gradients():
    cfg = TransformerConfig.tiny(recompute_tt_outputs=True)
    logits, g = run_step(cfg, True)
    logits_k, g_k = run_step(cfg.replace(recompute_attention=False), True)
    assert torch.equal(logits, logits_k)
    for name in g:
        assert_close_rel(g_k[name], g[name], 1e-6, name)
    with pytest.raises(ValueError, match="recompute_attention"):
        TransformerConfig.tiny(recompute_attention=0)
