"""The train_step bench's micro-batched step computes the whole batch's gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import bench.train_step_configs as tc
from engine.models.transformer import TransformerConfig


def test_micro_batches_sum_to_the_whole_batch_gradient():
    cfg = TransformerConfig.tiny(max_len=tc.SEQ, dropout=0.0, attn_dropout=0.0)
    torch.manual_seed(0)
    model = tc._model("tltorch", cfg, mnli=False).double()
    inputs = tc.make_inputs(5, cfg)
    params = list(model.parameters())
    whole = torch.autograd.grad(F.cross_entropy(model(*inputs[:3]), inputs[3]), params)
    parts = tc._micro_losses(model, inputs, 2)  # 2 + 2 + 1 sequences
    assert len(parts) == 3
    for loss in parts:
        loss().backward()
    for p, g in zip(params, whole, strict=True):
        assert torch.allclose(p.grad, g, rtol=1e-12, atol=1e-14)


def test_only_tensorly_torch_above_its_micro_batch_runs_in_micro_batches():
    cfg = TransformerConfig.tiny(max_len=tc.SEQ)
    runner = tc._runner(
        "tltorch",
        tc._model("tltorch", cfg, mnli=False),
        tc.make_inputs(tc.MICRO_BATCH["tltorch"] + 1, cfg),
        galore_rank=4,
    )
    assert runner.info["micro_batches"] == 2 and len(runner.micro_losses) == 2
    dense = tc._runner("dense", tc._model("dense", cfg, mnli=False), tc.make_inputs(9, cfg), 4)
    assert dense.info["micro_batches"] == 1 and dense.micro_losses == ()
