"""Activation-aware TT-SVD: start the student where the training data says it matters.

Plain TT-SVD minimizes the weight error ``||W - W_tt||_F``. What the encoder needs is a small
error on the layer's outputs for the inputs it actually sees: ``||X (W - W_tt)^T||_F`` with
``X`` the layer's input rows. With the input Gram matrix ``C = X^T X = S^T S`` (Cholesky,
``S`` upper triangular)::

    ||X (W - A)^T||_F = ||S (W^T - A^T)||_F

so the best rank-``r`` ``A^T`` is ``S^{-1} [S W^T]_r`` (``[.]_r``: truncated SVD; the
"whitened" truncation of SVD-LLM, Wang et al. 2024). :func:`whitened_weight` computes it and
the layer is rebuilt by TT-SVD of that matrix with the same modes and rank caps, so the shapes
(and the compression) do not change. The middle bond of a TT linear (between input and output
modes) is the matrix rank, so with ``d = 2`` modes per side and ``max_rank`` at least the outer
modes the TT holds the whitened matrix exactly; with more modes the inner bonds truncate too.

``C`` is summed over the attended tokens of calibration sentences drawn from the training
split only, run through the frozen teacher (float64 accumulation, a small ridge
``1e-6 * mean(diag C)`` keeps ``S`` invertible). :func:`balance_cores_` then rescales the cores
to equal Frobenius norms (their product, hence the layer, unchanged), so one Adam learning rate
moves every core by a similar relative amount (TT-SVD leaves all the norm in the last core).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor, nn

from engine.nn.tt_linear import TTLinear

__all__ = [
    "input_gram",
    "whitened_weight",
    "whitened_spectrum",
    "balance_cores_",
    "whiten_tt_linears_",
    "rebuild_tt",
    "replace_module_",
]

RIDGE = 1e-6


@torch.no_grad()
def input_gram(
    teacher: nn.Module,
    names: Iterable[str],
    batches: Iterable[Mapping[str, Tensor]],
    *,
    sentences: int,
    device: torch.device,
    forward: Callable[[Tensor, Tensor, Tensor | None], object] | None = None,
) -> tuple[dict[str, Tensor], int]:
    """``({name: X^T X (in, in) float64}, sentences used)`` over the attended tokens;
    ``forward(ids, mask, types)`` runs the teacher (default: ``teacher(ids, mask, types)``)."""
    grams: dict[str, Tensor] = {}
    keep: list[Tensor] = []

    def hook(name: str):
        def run(module: nn.Module, args: tuple, output: Tensor) -> None:
            x = args[0][keep[0]].double()  # (N, in) attended tokens only
            grams[name] = grams[name] + x.T @ x if name in grams else x.T @ x  # (in, in)

        return run

    handles = [teacher.get_submodule(n).register_forward_hook(hook(n)) for n in names]
    seen = 0
    try:
        for batch in batches:
            if seen >= sentences:
                break
            ids = batch["input_ids"][: sentences - seen].to(device)  # (B, S)
            mask = batch["attention_mask"][: sentences - seen].to(device).bool()  # (B, S)
            types = batch.get("token_type_ids")
            types = None if types is None else types[: sentences - seen].to(device)  # (B, S)
            keep[:] = [mask]
            (forward or teacher)(ids, mask, types)
            seen += ids.shape[0]
    finally:
        for h in handles:
            h.remove()
    return grams, seen


def _whitener(gram: Tensor) -> Tensor:
    """``S (in, in)`` upper triangular with ``C + ridge = S^T S``."""
    n = gram.shape[0]
    c = gram + RIDGE * gram.diagonal().mean().clamp_min(1e-30) * torch.eye(
        n, dtype=gram.dtype, device=gram.device
    )  # (in, in)
    return torch.linalg.cholesky(c).mT  # (in, in) upper: C = S^T S


def whitened_weight(weight: Tensor, gram: Tensor, rank: int) -> Tensor:
    """The rank-``rank`` ``A (out, in)`` minimizing ``||S (W^T - A^T)||_F``, ``C = S^T S``."""
    s = _whitener(gram)  # (in, in)
    u, sv, vh = torch.linalg.svd(s @ weight.to(gram.dtype).T, full_matrices=False)
    r = min(rank, sv.numel())
    top = (u[:, :r] * sv[:r]) @ vh[:r]  # (in, out) [S W^T]_r
    return torch.linalg.solve_triangular(s, top, upper=True).T  # (out, in)


def whitened_spectrum(weight: Tensor, gram: Tensor) -> Tensor:
    """Singular values ``(q,)`` of ``S W^T``, descending: their squares past rank ``r`` are
    the output energy :func:`whitened_weight` at ``r`` leaves out."""
    return torch.linalg.svdvals(_whitener(gram) @ weight.to(gram.dtype).T)


@torch.no_grad()
def balance_cores_(layer: TTLinear) -> None:
    """Rescale the cores to one common Frobenius norm; the product is unchanged."""
    norms = torch.stack([c.detach().double().norm() for c in layer.cores])  # (K,)
    if not bool((norms > 0).all()):
        return
    target = norms.log().mean().exp()  # () geometric mean: the scales multiply to 1
    for core, norm in zip(layer.cores, norms, strict=True):
        core.mul_((target / norm).to(core.dtype))


def rebuild_tt(
    old: TTLinear, weight: Tensor, bias: Tensor | None, *, max_rank: int | None = None
) -> TTLinear:
    """A ``TTLinear`` with ``old``'s modes, rank caps and plan: TT-SVD of ``weight (out, in)``
    (plus ``bias``), cores balanced. ``max_rank``: a new cap for every bond instead."""
    probe = nn.Linear(old.in_features, old.out_features, bias=bias is not None, device="meta")
    probe.weight = nn.Parameter(weight.detach().to(old.cores[0].dtype))
    if bias is not None:
        probe.bias = nn.Parameter(bias.detach().to(old.cores[0].dtype))
    new = TTLinear.from_linear(
        probe,
        max_rank=max(old.ranks) if max_rank is None else max_rank,
        in_modes=old.in_modes,
        out_modes=old.out_modes,
        gate_threshold=old.gate_threshold,
        plan=old.plan,
    )
    if max_rank is None and new.ranks != old.ranks:  # one cap reproduces the converted ranks
        raise RuntimeError(f"rebuilt ranks {new.ranks} != {old.ranks}")
    balance_cores_(new)
    return new


def replace_module_(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent), attr, module)


@torch.no_grad()
def whiten_tt_linears_(
    model: nn.Module, teacher: nn.Module, grams: Mapping[str, Tensor]
) -> list[dict]:
    """Rebuild every ``TTLinear`` named in ``grams`` from the whitened truncation of the
    teacher's dense weight (same modes and ranks); returns per-layer rows with the relative
    output error ``||S (W^T - W_tt^T)|| / ||S W^T||`` before and after."""
    rows = []
    for name, gram in grams.items():
        old = model.get_submodule(name)
        dense = teacher.get_submodule(name)
        assert isinstance(old, TTLinear) and isinstance(dense, nn.Linear)
        target = whitened_weight(dense.weight, gram, old.ranks[len(old.in_modes)])  # (out, in)
        new = rebuild_tt(old, target, old.bias)
        errors = [_output_error(dense.weight, m.to_dense(), gram) for m in (old, new)]
        replace_module_(model, name, new)
        rows.append(
            {"name": name, "output_error_tt_svd": errors[0], "output_error_whitened": errors[1]}
        )
    return rows


def _output_error(weight: Tensor, approx: Tensor, gram: Tensor) -> float:
    """``sqrt(tr(D C D^T) / tr(W C W^T))`` with ``D = W - approx``: relative output error."""
    w = weight.to(gram.dtype)  # (out, in)
    diff = w - approx.to(gram.dtype)  # (out, in)
    num = ((diff @ gram) * diff).sum()  # ()
    den = ((w @ gram) * w).sum()  # ()
    return float((num / den).clamp_min(0).sqrt())
