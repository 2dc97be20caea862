"""Dropout masks drawn by two threads equal the chunk-by-chunk draw; dropout applied through a
uint8 view of its bool mask, and dropout fused with the residual add: bitwise the arithmetic
of a float mask ``m / keep`` (float32), the same mask draws, only the bool mask saved, and the
unfused fallbacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.nn.dropout as dr
from engine.models.transformer import TransformerConfig, build_transformer
from engine.nn.dropout import CHUNK, dropout, dropout_add, dropout_mask, keep_threshold16
from tests.engine.models.test_transformer_perf import saved_tensors


def _chunk_by_chunk(seed: int, n: int, keep: float) -> np.ndarray:
    """The definition of a mask: chunk ``c`` is drawn whole from ``SeedSequence((seed, c))``."""
    out = np.empty(n, dtype=np.bool_)
    threshold = keep_threshold16(keep)
    for c in range(-(-n // CHUNK)):
        lo, hi = c * CHUNK, min(n, (c + 1) * CHUNK)
        bits = np.random.PCG64(np.random.SeedSequence((seed, c)))
        if threshold is not None:
            v = bits.random_raw(-(-(hi - lo) // 4)).view(np.uint16)[: hi - lo]
            out[lo:hi] = v < threshold
        else:
            out[lo:hi] = np.random.Generator(bits).random(hi - lo, dtype=np.float32) < keep
    return out


@pytest.mark.parametrize("n", [dr.SPLIT_FROM - 3, dr.SPLIT_FROM + 6, 3 * CHUNK + 1234, 5 * CHUNK])
@pytest.mark.parametrize("keep", [0.9, 0.77])  # 16-bit draws; float32 draws
def test_masks_drawn_by_two_threads_equal_the_chunk_by_chunk_draw(n, keep):
    torch.manual_seed(8)
    got = dropout_mask((n,), keep)
    torch.manual_seed(8)
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))  # the draw dropout_mask makes
    assert np.array_equal(got.numpy(), _chunk_by_chunk(seed, n, keep))
    torch.manual_seed(8)
    mask, scaled = dropout_mask((n,), keep, scale=2.0)
    assert torch.equal(mask, got) and torch.equal(scaled, got.float() * 2.0)


def _float_mask(shape, p: float, seed: int) -> torch.Tensor:
    """``m * float32(1 / keep)``: the float mask a float32 dropout multiplies by."""
    torch.manual_seed(seed)
    m = dropout_mask(shape, 1.0 - p)  # (shape) bool, the draw dropout makes
    return m.to(torch.float32) * torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)


@pytest.mark.parametrize("p", [0.1, 0.37])
def test_dropout_is_bitwise_the_float_mask_product(p):
    x = torch.randn(3, 70, 50, requires_grad=True)  # 10500 entries, odd sizes
    scaled = _float_mask(x.shape, p, seed=4)
    torch.manual_seed(4)
    kept, y = saved_tensors(lambda: dropout(x, p))
    assert torch.equal(y, x * scaled)
    dy = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, [x], dy)
    assert torch.equal(gx, dy * scaled)
    assert [t.dtype for t in kept] == [torch.bool]


@pytest.mark.parametrize("p", [0.1, 0.37])
def test_dropout_add_is_bitwise_add_of_the_dropped_branch(p):
    x = torch.randn(4, 33, 20, requires_grad=True)
    y = torch.randn(4, 33, 20, requires_grad=True)
    scaled = _float_mask(y.shape, p, seed=9)
    torch.manual_seed(9)
    kept, z = saved_tensors(lambda: dropout_add(x, y, p))
    assert torch.equal(z, x + y * scaled)
    torch.manual_seed(9)
    assert torch.equal(z, x + dropout(y, p))  # the same draw as the two ops
    dz = torch.randn_like(z)
    gx, gy = torch.autograd.grad(z, [x, y], dz)
    assert torch.equal(gx, dz) and torch.equal(gy, dz * scaled)
    assert [t.dtype for t in kept] == [torch.bool]


def test_dropout_add_falls_back_where_it_cannot_fuse():
    x, y = torch.randn(5, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    torch.manual_seed(2)
    got = dropout_add(x, y, 0.5)  # broadcast: x + dropout(y)
    torch.manual_seed(2)
    assert torch.equal(got, x + dropout(y, 0.5))
    assert torch.equal(dropout_add(x, x, 0.5, training=False), x + x)
    assert torch.equal(dropout_add(x, x, 0.0), x + x)
    assert torch.equal(dropout_add(x, x, 1.0), x)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout_add(x, x, -0.1)


@pytest.mark.parametrize("tensorized", [False, True])
def test_encoder_blocks_draw_what_separate_dropouts_draw(tensorized):
    """The block's fused branches give the model exactly the output of ``x + dropout(f(x))``."""
    cfg = TransformerConfig.tiny(max_len=16, dropout=0.2, attn_dropout=0.0)
    model = build_transformer(cfg, tensorized=tensorized, max_rank=4, shapes="auto")
    model.train()
    ids = torch.randint(0, cfg.vocab_size, (3, 16))
    torch.manual_seed(5)
    got = model(ids)
    torch.manual_seed(5)
    x = model.embeddings(ids, torch.zeros_like(ids))
    for block in model.encoder:
        x = block.norm1(x + block.attn(x, None))
        x = block.norm2(x + block.ffn(x))
    assert torch.equal(got, model.classifier(x[:, 0]))
