"""The exact size model ``S``: core entries of every TT / TTM layer at its active ranks.

For a chain of ``K`` cores with per-core mode sizes ``s_k`` and active ranks
``r_0 = 1, r_k = #{g_k > tau}, r_K = 1`` (docs/method.md#size-model)::

    S_layer = 1[all r_k > 0] * sum_k r_{k-1} * s_k * r_k        S = sum_layers S_layer

with ``s_k = n_k`` (input modes) then ``m_k`` (output modes) for :class:`TTLinear`, and
``s_k = n_k * m_k`` for :class:`TTMEmbedding`. The released code used ``n_k`` alone for TTM cores
and undercounted the embedding; here both kinds count every real core entry. A layer with a dead
bond is identically zero (only its bias is left) and counts 0. Gates and biases are not part of
``S``: gates fold into the cores at export and biases are never compressed.

``S`` counts *active* ranks; :func:`stored_size` counts the ranks of the stored cores. The two
agree right after :func:`engine.rank.shrink.shrink_model_`.
"""

from __future__ import annotations

from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.tt.cores import chain_numel

__all__ = [
    "TensorizedLayer",
    "tensorized_layers",
    "layer_mode_sizes",
    "layer_size",
    "model_size",
    "stored_size",
]

TensorizedLayer = TTLinear | TTMEmbedding


def tensorized_layers(model: nn.Module) -> list[tuple[str, TTLinear | TTMEmbedding]]:
    """Every TT / TTM layer of ``model`` with its qualified name, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, TensorizedLayer)]


def layer_mode_sizes(module: TTLinear | TTMEmbedding) -> tuple[int, ...]:
    """Entries per unit of ``r_{k-1} r_k`` in each core: ``s_k`` of the size formula."""
    if isinstance(module, TTLinear):
        return tuple(module.mode_sizes)
    if isinstance(module, TTMEmbedding):
        return tuple(n * m for n, m in zip(module.row_modes, module.col_modes, strict=True))
    raise TypeError(f"expected a TTLinear or TTMEmbedding, got {type(module).__name__}")


def layer_size(module: TTLinear | TTMEmbedding) -> int:
    """Core entries at the active ranks; 0 when any active internal rank is 0."""
    return chain_numel(layer_mode_sizes(module), module.active_ranks())


def model_size(model: nn.Module) -> int:
    """``S``: the sum of :func:`layer_size` over the tensorized layers."""
    return sum(layer_size(m) for _, m in tensorized_layers(model))


def stored_size(model: nn.Module) -> int:
    """Core entries actually stored (``numel`` of every core of every tensorized layer)."""
    return sum(sum(c.numel() for c in m.cores) for _, m in tensorized_layers(model))
