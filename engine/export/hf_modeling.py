"""Tensor-train linear layers on top of transformers' own model classes, in plain torch.

This file is copied verbatim into every ``model/hf/`` export as ``modeling_comera_tt.py``
(with the class that ``config.json``'s ``auto_map`` names appended), so that
``AutoModelFor<Task>.from_pretrained(dir, trust_remote_code=True)`` loads a compressed model
in any Python that has ``torch`` and ``transformers``: it imports nothing else. The engine
builds its exports with the same :class:`CompactTTLinear`, so the two cannot drift apart.

A :class:`CompactTTLinear` computes ``y = x W^T + b`` with ``W^T`` (in, out) the merge of
``2d`` cores ``G_k`` (r_{k-1}, s_k, r_k): the ``d`` input modes first, then the ``d`` output
modes, each multi-index row-major. ``x`` is zero-padded to the product of the input modes and
``y`` cut to ``out_features`` (sizes that do not factor exactly are padded). ``config.json``'s
``comera_tt`` lists, for every swapped module, its sizes, modes and ranks.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["CompactTTLinear", "swap_tt_layers"]


class CompactTTLinear(nn.Module):
    """A linear layer held as TT cores (no gates: they are folded in at export)."""

    def __init__(self, in_features, out_features, in_modes, out_modes, ranks, bias=True):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.in_modes, self.out_modes = tuple(in_modes), tuple(out_modes)
        modes = self.in_modes + self.out_modes
        if len(ranks) != len(modes) + 1:
            raise ValueError(f"{len(modes)} modes need {len(modes) + 1} ranks, got {ranks}")
        shapes = [(ranks[k], s, ranks[k + 1]) for k, s in enumerate(modes)]
        self.cores = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in shapes])
        self.bias = nn.Parameter(torch.zeros(self.out_features)) if bias else None

    def forward(self, x):
        lead = x.shape[:-1]
        n_in = math.prod(self.in_modes)
        z = x.reshape(-1, self.in_features)  # (B, in)
        if n_in > self.in_features:
            z = nn.functional.pad(z, (0, n_in - self.in_features))  # (B, N)
        b = z.shape[0]
        d = len(self.in_modes)
        z = z.reshape(b, 1, n_in)  # (B, r_0, N)
        for k in range(d):  # contract the input modes, most significant first
            core = self.cores[k]  # (r, n_k, s)
            z = z.reshape(b, core.shape[0], core.shape[1], -1)  # (B, r, n_k, rest)
            z = torch.einsum("brnq,rns->bsq", z, core)  # (B, s, rest)
        y = z.reshape(b, 1, -1)  # (B, out so far = 1, r_d)
        for k in range(d, 2 * d):  # expand the output modes, most significant first
            core = self.cores[k]  # (r, m_k, s)
            y = torch.einsum("bor,rms->boms", y, core)  # (B, out, m_k, s)
            y = y.reshape(b, -1, core.shape[2])  # (B, out * m_k, s)
        y = y.reshape(b, -1)[:, : self.out_features]  # (B, out)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self):
        ranks = [int(c.shape[0]) for c in self.cores] + [1]
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"in_modes={self.in_modes}, out_modes={self.out_modes}, ranks={tuple(ranks)}"
        )


def swap_tt_layers(model, layers):
    """Replace each module named in ``layers`` (``{name: record}``) by its TT layer."""
    for name, rec in layers.items():
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = CompactTTLinear(
            rec["in_features"],
            rec["out_features"],
            rec["in_modes"],
            rec["out_modes"],
            rec["ranks"],
            bias=rec["bias"],
        )
        setattr(parent, attr, layer)
    return model
