"""The automatic start's weights (``max_rank: "auto"``): the calibration's dense twin,
decomposed (docs/method.md#automatic-rank).

:func:`engine.train.auto_rank.calibrate` trains the job's dense twin for a few steps and
chooses the ranks from its weights; the model built at those ranks then starts from the twin
rather than from a fresh draw:

* each TT linear: the TT-SVD of the twin's weight (``W^T`` in the layer's modes, zero-padded
  as the layer pads) truncated to the layer's bond ranks, its bias copied;
* each TTM embedding: the TT-SVD of the twin's table the same way;
* every other parameter and buffer: the twin's value (same name, same shape).

Gates are 1: the singular values sit in the cores. The chosen ranks keep each twin weight
within the rule's tolerance, so the start computes nearly what the twin computes;
:func:`warm_start_` returns each layer's relative error.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.rank import tensorized_layers
from engine.tt.decompose import embedding_to_ttm, matrix_to_tt

__all__ = ["warm_start_"]


@torch.no_grad()
def warm_start_(model: nn.Module, dense: nn.Module) -> dict[str, Any]:
    """Set ``model`` (tensorized) from ``dense`` (its dense twin) in place; returns the record
    of the job report's ``auto_rank.probe.start``: per layer the relative Frobenius error of
    the start against the twin's weight. Raises ``ValueError``, ``model`` unchanged, where the
    two models do not correspond (a layer or parameter of one missing from, or shaped unlike,
    the other)."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        return _warm_start(model, dense)
    except ValueError:
        model.load_state_dict(before)
        raise


def _warm_start(model: nn.Module, dense: nn.Module) -> dict[str, Any]:
    errors: dict[str, float] = {}
    owned: set[str] = set()
    for name, layer in tensorized_layers(model):
        source = dense.get_submodule(name)
        rank = max(layer.ranks)
        if isinstance(layer, TTLinear) and isinstance(source, nn.Linear):
            fit = matrix_to_tt(source.weight, layer.in_modes, layer.out_modes, max_rank=rank)
        elif isinstance(layer, TTMEmbedding) and isinstance(source, nn.Embedding):
            fit = embedding_to_ttm(source.weight, layer.row_modes, layer.col_modes, max_rank=rank)
        else:
            raise ValueError(f"{name}: no dense twin of a {type(layer).__name__}")
        _place(list(layer.cores), [c.to(layer.cores[0].dtype) for c in fit], name)
        for gate in layer.gates:
            gate.fill_(1.0)
        errors[name] = _error(layer, source.weight)
        own = [*layer.named_parameters(), *layer.named_buffers()]
        owned |= {f"{name}.{n}" for n, _ in own if n != "bias"}
    _copy_the_rest(model, dense, owned)
    return {
        "from": "the TT-SVD of the dense twin after the calibration steps",
        "error": errors,
    }


def _place(cores: list[nn.Parameter], fitted: list[Tensor], name: str) -> None:
    """``fitted`` cores into the layer's ``cores``, shape for shape (a TT-SVD truncated at the
    layer's largest rank has the layer's bond ranks: both are that rank capped by the bond's
    bound)."""
    shapes = [tuple(c.shape) for c in cores]
    if shapes != [tuple(f.shape) for f in fitted]:
        raise ValueError(
            f"{name}: cores fitted as {[tuple(f.shape) for f in fitted]}, not {shapes}"
        )
    for core, fit in zip(cores, fitted, strict=True):
        core.copy_(fit)


def _error(layer: TTLinear | TTMEmbedding, weight: Tensor) -> float:
    """Relative Frobenius error of the layer's effective weight (gates applied; ``(out, in)``
    or ``(V, D)``, as the twin's) against the twin's."""
    return float((layer.to_dense() - weight).norm() / weight.norm().clamp_min(1e-30))


def _copy_the_rest(model: nn.Module, dense: nn.Module, owned: set[str]) -> None:
    """Every parameter and buffer of ``model`` outside the TT cores and gates: the twin's."""
    source = {**dict(dense.named_parameters()), **dict(dense.named_buffers())}
    mine = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for name, value in mine.items():
        if name in owned:
            continue
        twin = source.get(name)
        if twin is None or twin.shape != value.shape:
            raise ValueError(f"{name}: the dense twin has no {tuple(value.shape)} value for it")
        value.copy_(twin)
