"""Plain-loop references for the penalties (autograd flows through the gate entries)."""

from __future__ import annotations

import torch

from engine.rank.size import layer_mode_sizes, tensorized_layers
from tests.engine.rank.models import gates_of


def reference_weights(model, variant):
    """Per gate vector, the list of weights ``c_k / D_l`` (or 1) from a plain loop."""
    out = []
    for _, m in tensorized_layers(model):
        s, r, dense = layer_mode_sizes(m), m.active_ranks(), m.dense_parameters()
        for k, g in enumerate(m.gates):
            c = s[k] * r[k] + s[k + 1] * r[k + 2]
            out.append([c / dense if variant == "cost_weighted" else 1.0] * g.numel())
    return out


def reference_penalty(model, variant):
    """Sum over entries above tau of live layers (no dead bond): the module docstring's R."""
    num, den = 0.0, 0.0
    weights = reference_weights(model, variant)
    layers = [m for _, m in tensorized_layers(model) for _ in m.gates]
    for g, ws, m in zip(gates_of(model), weights, layers, strict=True):
        if min(m.active_ranks()) == 0:
            continue
        for e, w in enumerate(ws):
            if float(g[e].detach()) > m.gate_threshold:
                num = num + w * g[e]
                den += w
    return num / den if den else torch.zeros((), dtype=torch.float64)
