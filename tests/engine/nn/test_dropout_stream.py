"""Masks of the global batch (``engine.nn.dropout.mask_stream``): a process holding rows
``[start, stop)`` of the global batch draws exactly those rows of the global batch's mask, the
global mask is the chunk-by-chunk definition with the seed from ``(seed, step, call)``, and a
``torch.utils.checkpoint`` recompute draws the forward's masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.models.transformer import TransformerConfig, build_transformer
from engine.nn.dropout import CHUNK, SPLIT_FROM, MaskStream, dropout, dropout_mask, mask_stream
from engine.train.distributed import DistContext, rows_of
from tests.engine.nn.test_dropout import _chunk_by_chunk


def test_rows_of_is_tensor_splits_piece():
    for total in range(1, 20):
        for world in range(1, 6):
            pieces = torch.tensor_split(torch.arange(total), world)
            for rank in range(world):
                start, stop = rows_of(total, DistContext(rank, world, rank))
                assert torch.equal(torch.arange(start, stop), pieces[rank]), (total, world, rank)


SHAPES = [
    (6, 5, 7),  # 35 entries a row: slices start off a raw draw's boundary
    (4, 3, 5, 7),  # a mask of attention probabilities (B H, S, T) with B = 2: dim 0 is B H
    (4, CHUNK + 13),  # spans chunks; two threads draw it, and a rank's half of it (>= SPLIT_FROM)
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("keep", [0.9, 0.77])  # 16-bit draws; float32 draws
@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_ranks_mask_is_its_slice_of_the_global_mask(shape, keep, world):
    batch = 2 if shape[0] == 4 and len(shape) == 4 else shape[0]  # rows of the global batch
    per_row = shape[0] // batch  # dim-0 entries per batch row (heads, for attention)
    n = int(np.prod(shape))
    assert shape[1] < CHUNK or n // 2 >= SPLIT_FROM  # the big one: two threads at world 2
    with mask_stream(11, 3, (0, batch, batch)) as stream:
        first, second = dropout_mask(shape, keep), dropout_mask(shape, keep)  # (shape) bool
    reference = MaskStream(11, 3, 0, batch, batch)
    for got in (first, second):  # the i-th mask is the definition with the seed of (11, 3, i)
        assert np.array_equal(got.numpy().ravel(), _chunk_by_chunk(reference.next_seed(), n, keep))
    assert stream.calls == 2 and not torch.equal(first, second)
    if batch < world:
        return
    for rank in range(world):
        start, stop = rows_of(batch, DistContext(rank, world, rank))
        local = ((stop - start) * per_row, *shape[1:])
        with mask_stream(11, 3, (start, stop, batch)):
            mine = dropout_mask(local, keep), dropout_mask(local, keep)
        for got, whole in zip(mine, (first, second), strict=True):
            assert torch.equal(got, whole[start * per_row : stop * per_row]), (rank, world)


def test_masks_follow_seed_step_and_call_not_torch_generator():
    x = torch.ones(8, 33)
    draws = []
    for seed, step, torch_seed in [(1, 0, 0), (1, 0, 5), (1, 1, 0), (2, 0, 0)]:
        torch.manual_seed(torch_seed)
        with mask_stream(seed, step):
            draws.append(dropout(x, 0.3))
    assert torch.equal(draws[0], draws[1])  # torch's generator plays no part
    assert not torch.equal(draws[0], draws[2]) and not torch.equal(draws[0], draws[3])
    with mask_stream(1, 0, (0, 8, 8)):
        assert torch.equal(dropout(x, 0.3), draws[0])  # all rows: the default


def test_a_mask_whose_dim_0_is_not_batch_major_is_refused():
    with mask_stream(0, 0, (2, 5, 8)), pytest.raises(ValueError, match="batch-major"):
        dropout_mask((4, 10), 0.9)  # 3 rows held, 4 along dim 0


def test_a_checkpointed_block_recomputes_the_forward_masks():
    """``recompute=True`` reruns each block in backward: the gradients are those of the run
    that keeps the activations, masks and all."""
    grads = []
    for recompute in (False, True):
        cfg = TransformerConfig.tiny(max_len=16, dropout=0.2, attn_dropout=0.2, recompute=recompute)
        torch.manual_seed(0)
        model = build_transformer(cfg, tensorized=False)
        model.train()
        ids = torch.randint(0, cfg.vocab_size, (3, 16))
        with mask_stream(4, 9, (1, 4, 6)):  # rows 1-3 of a global batch of 6
            loss = model(ids).square().mean()
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, rtol=1e-5, atol=1e-7), name
