"""A tiny tensorized transformer trained a few steps, with dead gates and some layers shrunk."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from engine.export.manifest import tt_modules
from engine.models.registry import TensorizeOptions, get_workload
from engine.models.transformer import TransformerConfig


@dataclass
class Trained:
    model: nn.Module  # eval mode; tests must not modify it (deep-copy first)
    config: TransformerConfig
    options: TensorizeOptions
    batch: dict[str, Tensor]

    def export_kwargs(self) -> dict:
        return {
            "arch": "transformer",
            "model_config": self.config.to_dict(),
            "options": self.options.to_dict(),
            "tensorized": True,
        }

    def logits(self, model: nn.Module) -> Tensor:
        b = self.batch
        with torch.no_grad():
            return model(b["input_ids"], b["token_type_ids"], b["attention_mask"])  # (B, C)


def make_batch(vocab: int, b: int = 4, s: int = 12) -> dict[str, Tensor]:
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[0, s // 2 :] = False  # one padded row
    return {
        "input_ids": torch.randint(0, vocab, (b, s)),
        "token_type_ids": (torch.arange(s) >= s // 2).long().expand(b, s).contiguous(),
        "attention_mask": mask,
        "labels": torch.randint(0, 3, (b,)),
    }


@torch.no_grad()
def kill_and_shrink_(model: nn.Module) -> None:
    """Put gate entries below the threshold in every layer and shrink every other layer.

    ``encoder.1.attn.v`` loses a whole bond (its weight is exactly zero, ranks all 0).
    """
    for i, (name, mod) in enumerate(tt_modules(model).items()):
        tau = mod.gate_threshold
        g = mod.gates[i % len(mod.gates)]
        g[: 1 + i % 3] = tau / 2  # dead: <= tau
        g[-1] = -0.3  # negative gates are dead too
        if len(mod.gates) > 1:
            mod.gates[-1][0] = 0.5  # alive but not 1: folding must carry it
        if name == "encoder.1.attn.v":
            mod.gates[0].fill_(0.0)
        if i % 2:
            mod.shrink_()


@pytest.fixture(scope="session")
def trained() -> Trained:
    torch.manual_seed(1)
    config, options = TransformerConfig.tiny(), TensorizeOptions(max_rank=6)
    workload = get_workload("transformer")
    model = workload.build(config, tensorized=True, options=options)
    batch = make_batch(config.vocab_size)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        out = workload.forward_loss(model, batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    kill_and_shrink_(model)
    return Trained(model.eval(), config, options, batch)
