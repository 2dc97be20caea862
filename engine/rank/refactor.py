"""Refactoring TT linears into more cores, exactly (docs/method.md#late-refactor).

A two-core TT linear (``W^T = U V``, one bond of rank ``r``) can cut only that bond: every rank
it gives up is one row of ``U`` and one column of ``V``, ``n_in + n_out`` entries at a time, and
at a fifth of its size it is a rank-``r / 5`` matrix. The same weight in ``d`` modes per side
(input modes ``n_1..n_d``, output modes ``m_1..m_d``) has ``2d - 1`` bonds; the bond between
the input and the output modes is the matrix rank ``r``, and the others can be cut as well.

:func:`refactor_layer` rewrites one layer in ``d`` modes per side without changing what it
computes: the TT-SVD (float64) of its effective weight (gates applied), cut only where the
singular values are zero to float64 precision, so the bond between the sides keeps rank ``r``
and the outer bonds their full rank (``n_1`` and ``m_d`` for two modes per side). Its gates
start at 1 (the old gates are folded into the cores); its cores cost a few more entries than
``U`` and ``V`` (``n_1^2 + m_d^2`` for two modes per side).

:func:`refactor_model_` does it for every TT linear of fewer modes per side and keeps an
optimizer in step: the old cores and gates and their state leave their groups, the new ones
join the ``cores`` and ``gates`` groups with a fresh state (moments of a different
factorization do not carry over); the bias stays the same parameter, state and all. The
parameter order this leaves is the same on every call, so a resumed run that refactors the
model it builds before loading a checkpoint matches the run that wrote it. Such a run asks
for the shapes alone (``exact=False``: the modes, rank-1 cores for the load to resize), not
for a TT-SVD of the weights the load replaces.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn

from engine.nn.tt_linear import TTLinear

__all__ = ["EXACT_TOL", "refactor_layer", "refactor_model_"]

# relative Frobenius error of the TT-SVD: float64 round-off, so only zero singular values go
EXACT_TOL = 1e-12


def refactor_layer(layer: TTLinear, d: int) -> TTLinear:
    """``layer`` as a TT linear of ``d`` modes per side computing the same ``y`` (module
    doc): same features, bias (the same parameter: its optimizer state stays), gate threshold,
    plan and kernel; cores on ``layer``'s device and dtype."""
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    first = layer.cores[0]
    with torch.no_grad():
        weight = layer.to_dense(torch.float64)  # (out, in)
    new = TTLinear.from_weight(
        weight,
        tol=EXACT_TOL,
        d=d,
        gate_threshold=layer.gate_threshold,
        plan=layer.plan,
        kernel=layer.kernel,
    ).to(device=first.device, dtype=first.dtype)
    new.bias = layer.bias
    return new


def _shell(layer: TTLinear, d: int) -> TTLinear:
    """:func:`refactor_layer`'s shapes without its values: ``d`` modes per side, rank-1
    cores (a checkpoint's load gives them their shapes and values), the same bias."""
    first = layer.cores[0]
    new = TTLinear(
        layer.in_features,
        layer.out_features,
        layer.bias is not None,
        max_rank=1,
        d=d,
        gate_threshold=layer.gate_threshold,
        plan=layer.plan,
        kernel=layer.kernel,
        device=first.device,
        dtype=first.dtype,
    )
    new.bias = layer.bias
    return new


def refactor_model_(
    model: nn.Module,
    d: int,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    only: Collection[str] | None = None,
    exact: bool = True,
) -> dict[str, dict[str, list[int]]]:
    """Replace every :class:`TTLinear` of ``model`` (of the names in ``only``, if given) with
    fewer than ``d`` modes per side by :func:`refactor_layer` (``exact``) or its shapes alone
    (module doc), ``optimizer``'s groups following. Returns per layer its ``ranks`` before and
    after and its new modes (empty: nothing to refactor)."""
    done: dict[str, dict[str, list[int]]] = {}
    old: set[int] = set()
    new: dict[str, list[nn.Parameter]] = {"cores": [], "gates": []}
    for name, layer in list(model.named_modules()):
        if not isinstance(layer, TTLinear) or len(layer.in_modes) >= d:
            continue
        if only is not None and name not in only:
            continue
        if min(layer.in_features, layer.out_features) < 2**d:
            continue  # too narrow for d modes of at least 2 a side
        out = refactor_layer(layer, d) if exact else _shell(layer, d)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, out)
        old.update(id(p) for p in (*layer.cores, *layer.gates))
        new["cores"].extend(out.cores)
        new["gates"].extend(out.gates)
        done[name] = {
            "ranks_before": list(layer.ranks),
            "ranks_after": list(out.ranks),
            "in_modes": list(out.in_modes),
            "out_modes": list(out.out_modes),
        }
    if optimizer is not None and done:
        _follow(optimizer, old, new)
    return done


def _follow(
    optimizer: torch.optim.Optimizer, old: set[int], new: dict[str, list[nn.Parameter]]
) -> None:
    """Drop the parameters whose ``id`` is in ``old`` (and their state) from ``optimizer``;
    append ``new[group]`` to the param group of that ``name``."""
    for p in [p for p in optimizer.state if id(p) in old]:
        del optimizer.state[p]
    by_name = {g.get("name"): g for g in optimizer.param_groups}
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in old]
    for name, params in new.items():
        if not params:
            continue
        if name not in by_name:
            raise ValueError(f"the optimizer has no {name!r} param group to add the new layers to")
        by_name[name]["params"].extend(params)
