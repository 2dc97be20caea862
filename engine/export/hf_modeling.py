"""Tensor-train linear layers on top of transformers' own model classes, in plain torch.

This file is copied verbatim into every ``model/hf/`` export as ``modeling_comera_tt.py``
(with the class that ``config.json``'s ``auto_map`` names appended), so that
``AutoModelFor<Task>.from_pretrained(dir, trust_remote_code=True)`` loads a compressed model
in any Python that has ``torch`` and ``transformers``: it imports nothing else. The engine
builds its exports with the same :class:`CompactTTLinear`, so the two cannot drift apart.

A :class:`CompactTTLinear` computes ``y = x W^T + b`` with ``W^T`` (in, out) the merge of
``2d`` cores ``G_k`` (r_{k-1}, s_k, r_k): the ``d`` input modes first, then the ``d`` output
modes, each multi-index row-major. It merges the input cores into ``A`` (in, r_d) and the
output cores into ``B`` (r_d, out), ``r_d`` the middle bond, and computes ``(x A) B``: two thin
matrix products of ``in * r_d + r_d * out`` multiply-adds a row instead of ``in * out`` (the
factors are cached for inference). ``x`` is zero-padded to the product of the input modes and
``y`` cut to ``out_features`` (sizes that do not factor exactly are padded). ``config.json``'s
``comera_tt`` lists, for every swapped module, its sizes, modes and ranks.
"""

from __future__ import annotations

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

    def factors(self):
        """``(A, B)``: the input cores merged to A (N, r_d), the output cores to B (r_d, M),
        so that ``W^T = A B`` (N, M: the padded sizes; r_d the middle bond). Cached while
        the cores are unchanged and no gradient is recorded (inference)."""
        key = tuple((c.data_ptr(), c._version) for c in self.cores)
        cached = self.__dict__.get("_factors")
        if cached is not None and cached[0] == key and not torch.is_grad_enabled():
            return cached[1]
        d = len(self.in_modes)
        a = self.cores[0].reshape(-1, self.cores[0].shape[-1])  # (n_1, r_1)
        for core in list(self.cores)[1:d]:  # (r, n_k, s)
            a = (a @ core.reshape(core.shape[0], -1)).reshape(-1, core.shape[-1])  # (N_k, s)
        b = self.cores[d].reshape(self.cores[d].shape[0], -1, self.cores[d].shape[-1])
        for core in list(self.cores)[d + 1 :]:  # b: (r_d, M_k, r); core: (r, m_k, s)
            b = torch.einsum("pmr,rns->pmns", b, core).reshape(b.shape[0], -1, core.shape[-1])
        b = b.reshape(b.shape[0], -1)  # (r_d, M)
        if not torch.is_grad_enabled():
            self.__dict__["_factors"] = (key, (a, b))
        return a, b

    def forward(self, x):
        lead = x.shape[:-1]
        a, b = self.factors()  # (N, r_d), (r_d, M)
        z = x.reshape(-1, self.in_features)  # (B, in)
        if a.shape[0] > self.in_features:
            z = nn.functional.pad(z, (0, a.shape[0] - self.in_features))  # (B, N)
        y = (z @ a) @ b  # (B, M): two thin products instead of one (in, out) one
        y = y[:, : self.out_features]  # (B, out)
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
