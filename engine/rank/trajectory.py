"""JSON-safe snapshots of ranks and sizes, for the training log and the job report.

:func:`rank_snapshot` gives one row per tensorized layer; :func:`compression_summary` gives the
totals. Sizes are the exact size model of :mod:`engine.rank.size` (active ranks, gates excluded,
biases not compressed). Ratios are ``dense / params`` and ``None`` where the layer (or model) has
no core entries left (an infinite ratio has no JSON form).
"""

from __future__ import annotations

from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.rank.size import layer_size, tensorized_layers

__all__ = ["rank_snapshot", "compression_summary"]


def _ratio(dense: int, params: int) -> float | None:
    return dense / params if params else None


def rank_snapshot(model: nn.Module) -> dict[str, dict]:
    """Per layer: ``kind``, ``modes``, ``ranks`` (stored), ``active_ranks``, ``params``, ``dense``,
    ``ratio``.

    ``kind`` is ``"tt_linear"`` (``modes = [in_modes, out_modes]``) or ``"ttm_embedding"``
    (``modes = [row_modes, col_modes]``); ``params`` is the layer's size at its active ranks.
    """
    out: dict[str, dict] = {}
    for name, layer in tensorized_layers(model):
        if isinstance(layer, TTLinear):
            kind, modes = "tt_linear", [list(layer.in_modes), list(layer.out_modes)]
        else:
            kind, modes = "ttm_embedding", [list(layer.row_modes), list(layer.col_modes)]
        params, dense = layer_size(layer), layer.dense_parameters()
        out[name] = {
            "kind": kind,
            "modes": modes,
            "ranks": [int(r) for r in layer.ranks],
            "active_ranks": list(layer.active_ranks()),
            "params": params,
            "dense": dense,
            "ratio": _ratio(dense, params),
        }
    return out


def compression_summary(model: nn.Module) -> dict:
    """Totals over the tensorized layers, and whole-model parameter counts.

    ``tensorized_dense`` / ``tensorized_params`` (active) / ``tensorized_stored`` and their
    ``tensorized_ratio``; ``other_params`` counts every parameter that is not a TT core or gate
    (biases of TT layers included); ``model_params = other_params + tensorized_params`` is the
    model as exported (gates folded away), ``model_params_dense = other_params +
    tensorized_dense`` the same model with dense layers, ``model_ratio`` their ratio;
    ``gate_entries`` / ``active_gate_entries`` count the gates (active: above ``tau`` in a layer
    that is not zero, as :meth:`engine.rank.penalty.GateIndex.active_entries`).
    """
    layers = tensorized_layers(model)
    tt_ids: set[int] = set()
    dense = params = stored = gates = active = 0
    for _, layer in layers:
        dense += layer.dense_parameters()
        size = layer_size(layer)
        params += size
        stored += sum(c.numel() for c in layer.cores)
        gates += sum(g.numel() for g in layer.gates)
        active += sum(layer.active_ranks()[1:-1]) if size else 0  # a zero layer has none
        tt_ids.update(id(p) for p in (*layer.cores, *layer.gates))
    other = sum(p.numel() for p in model.parameters() if id(p) not in tt_ids)
    return {
        "tensorized_layers": len(layers),
        "tensorized_dense": dense,
        "tensorized_params": params,
        "tensorized_stored": stored,
        "tensorized_ratio": _ratio(dense, params),
        "other_params": other,
        "model_params": other + params,
        "model_params_dense": other + dense,
        "model_ratio": _ratio(other + dense, other + params),
        "gate_entries": gates,
        "active_gate_entries": active,
    }
