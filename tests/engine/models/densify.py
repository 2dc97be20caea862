"""Test helper: swap every TT / TTM layer for its dense reconstruction (the oracle model)."""

from __future__ import annotations

import torch
from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding


def densify_(model: nn.Module) -> list[str]:
    """Replace ``TTLinear`` by ``nn.Linear(to_dense())`` and ``TTMEmbedding`` by its table."""
    replaced = []
    for name, mod in list(model.named_modules()):
        if isinstance(mod, TTLinear):
            w = mod.to_dense().detach()  # (out, in)
            new: nn.Module = nn.Linear(
                mod.in_features, mod.out_features, mod.bias is not None, dtype=w.dtype
            )
            with torch.no_grad():
                new.weight.copy_(w)
                if mod.bias is not None:
                    new.bias.copy_(mod.bias)
        elif isinstance(mod, TTMEmbedding):
            new = nn.Embedding.from_pretrained(mod.to_dense().detach().clone(), freeze=False)
        else:
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, new)
        replaced.append(name)
    return replaced


def perturb_gates_(model: nn.Module, generator: torch.Generator) -> None:
    """Random gate values with some entries at or below the threshold (masked)."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, TTLinear | TTMEmbedding):
                for g in mod.gates:
                    vals = torch.rand(g.shape, generator=generator, dtype=torch.float64) + 0.5
                    vals[1::3] = mod.gate_threshold / 2  # masked entries (entry 0 stays live)
                    g.copy_(vals.to(g.dtype))
