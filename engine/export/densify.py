"""``densify``: a plain-torch copy of a tensorized model (no TT code needed to run it).

Every :class:`~engine.nn.tt_linear.TTLinear` becomes ``nn.Linear`` holding ``to_dense()``
(gates applied, padding dropped) and its bias; every
:class:`~engine.nn.ttm_embedding.TTMEmbedding` becomes ``nn.Embedding`` holding its table
(first ``num_embeddings`` rows, the ``padding_idx`` row zero as the TTM lookup returns it, and
``padding_idx`` kept so it also gets no gradient). The dense weights are the TT layers' own
dense oracles, so outputs agree to float rounding. A module shared at several places stays
shared. The input model is not modified.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding

__all__ = ["densify", "dense_module"]


@torch.no_grad()
def dense_module(mod: TTLinear | TTMEmbedding) -> nn.Linear | nn.Embedding:
    """The plain-torch layer equal to one tensorized layer, on its device and dtype."""
    core = mod.cores[0]
    kw = {"device": core.device, "dtype": core.dtype}
    if isinstance(mod, TTLinear):
        lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, **kw)
        lin.weight.copy_(mod.to_dense())  # (out, in)
        if mod.bias is not None:
            lin.bias.copy_(mod.bias)
        lin.train(mod.training)
        return lin
    emb = nn.Embedding(mod.num_embeddings, mod.embedding_dim, padding_idx=mod.padding_idx, **kw)
    emb.weight.copy_(mod.to_dense()[: mod.num_embeddings])  # (V, D), padding row zero
    emb.train(mod.training)
    return emb


def densify(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every TT / TTM layer replaced by its dense twin."""
    if isinstance(model, TTLinear | TTMEmbedding):
        return dense_module(model)
    out = copy.deepcopy(model)
    replaced: dict[int, nn.Module] = {}  # id(tt module) -> its dense twin
    for parent in list(out.modules()):
        for child_name, child in list(parent._modules.items()):  # duplicates included
            if isinstance(child, TTLinear | TTMEmbedding):
                if id(child) not in replaced:
                    replaced[id(child)] = dense_module(child)
                setattr(parent, child_name, replaced[id(child)])
    return out
