"""One parameter budget for all the TT linears of a BERT encoder: which layer gets which rank.

A single ``max_rank`` for every layer spends the same on a query projection as on the value
projection of the last block, although their errors cost the sentence embedding very
different amounts. :func:`allocate_ranks` spends ``budget`` TT core entries greedily: starting
from rank 1 everywhere, it raises, one step at a time, the rank of the layer whose next step
buys the most modelled distortion reduction per added entry, until no step fits the budget.

The distortion model of a layer is ``weight * eps(r)``, with ``eps(r) = sum_{i >= r} e_i /
sum e_i`` the relative whitened energy it leaves out at rank ``r`` (``e_i``: squared singular
values of ``M = S^{-T} cov(X, Y)`` on the teacher's own inputs, see
:mod:`engine.models.hf_bert.calib`; the same spectrum the whitened truncation cuts) and:

* ``energy``: ``weight = 1``: relative output error, the same for every layer;
* ``sensitivity``: ``weight = g^i dcos / eps(r0)``, with ``dcos`` the mean ``1 - cos`` between
  the teacher's mean-pooled sentence embeddings and those of the teacher with only this layer
  replaced by its whitened rank-``r0`` fit, on probe sentences of the training split (``r0``:
  the largest uniform rank within the budget), ``i`` the layer's block and ``g`` the
  ``depth_gain``. A first-order model: measured once per layer, additive over layers. The
  probe sees one layer's error with every other layer exact; the sequential fit
  (:mod:`engine.models.hf_bert.calib`) then refits each layer on the compressed layers below
  it, so an early layer's error is partly undone by the refits above it and a late one's is
  not. ``g > 1`` moves the budget up the stack accordingly: on MiniLM at 5x, held-out cosine
  after the sequential fit 0.850 / 0.858 / 0.864 / 0.866 / 0.867 at ``g`` = 1 / 1.25 / 1.45 /
  1.8 / 2.3 (0.866 at 3; 256 sentences; 2 is the default).

The cost of rank ``r`` is the TT entries of the layer when every bond is capped at ``r``
(:func:`tt_params_at_rank`; ``r (in + out)`` for two cores, ``d = 1``). For ``d >= 2`` the
spectrum is the matrix rank's (the middle bond); outer bonds below their mode sizes truncate
further, which the model does not see.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.models.hf_bert.batches import Batch, as_dicts, by_length, take_sentences
from engine.models.hf_bert.calib import (
    Whitened,
    embed,
    encoder_layers,
    run_block,
    solve,
    teacher_stage_stats,
)
from engine.models.hf_bert.config import ALLOCATIONS
from engine.nn.tt_linear import TTLinear
from engine.tt.cores import chain_numel

__all__ = [
    "LayerProfile",
    "tt_params_at_rank",
    "uniform_rank",
    "allocate_ranks",
    "probe_sensitivity",
    "plan_ranks",
    "depth_weighted",
    "PROFILE_SENTENCES",
    "profile_first",
    "probe_batches",
]

PROFILE_SENTENCES = 256  # calibration sentences the teacher's spectra are taken on


def tt_params_at_rank(layer: TTLinear, rank: int) -> int:
    """TT core entries of ``layer``'s modes with every bond capped at ``rank`` (and at what
    the unfoldings allow)."""
    sizes = layer.mode_sizes
    inner = [min(rank, math.prod(sizes[:k]), math.prod(sizes[k:])) for k in range(1, len(sizes))]
    return chain_numel(sizes, [1, *inner, 1])


@dataclass(frozen=True)
class LayerProfile:
    """What the allocator knows of one layer: its whitened energies, sizes and weight."""

    name: str
    energy: Tensor  # (q,) squared singular values, descending
    costs: tuple[int, ...]  # costs[r]: TT entries at rank r, r = 0 .. max rank
    weight: float = 1.0

    @property
    def max_rank(self) -> int:
        return len(self.costs) - 1

    def left_out(self, rank: int) -> float:
        """``eps(rank)``: the relative energy beyond ``rank``."""
        e = self.energy.double()
        return float(e[rank:].sum() / e.sum().clamp_min(1e-300))


def uniform_rank(profiles: Sequence[LayerProfile], budget: float) -> int:
    """The largest rank that every layer can take within ``budget`` (at least 1)."""
    top = max(p.max_rank for p in profiles)
    best = 1
    for r in range(1, top + 1):
        if sum(p.costs[min(r, p.max_rank)] for p in profiles) > budget:
            break
        best = r
    return best


def allocate_ranks(profiles: Sequence[LayerProfile], budget: float) -> dict[str, int]:
    """Greedy ranks (module docstring): every layer at least 1, total cost ``<= budget`` when
    rank 1 everywhere fits."""
    ranks = {p.name: 1 for p in profiles}
    used = sum(p.costs[1] for p in profiles)
    totals = {p.name: float(p.energy.double().sum().clamp_min(1e-300)) for p in profiles}

    def gain(p: LayerProfile) -> float:
        r = ranks[p.name]
        step = p.costs[r + 1] - p.costs[r]
        value = p.weight * float(p.energy[r]) / totals[p.name] if r < p.energy.numel() else 0.0
        return value / max(step, 1)

    heap = [(-gain(p), i) for i, p in enumerate(profiles) if p.max_rank > 1]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        p = profiles[i]
        r = ranks[p.name]
        step = p.costs[r + 1] - p.costs[r]
        if used + step > budget:
            continue  # this layer cannot grow any more; the others may
        ranks[p.name] = r + 1
        used += step
        if r + 1 < p.max_rank:
            heapq.heappush(heap, (-gain(p), i))
    return ranks


def _pooled(hidden: Tensor, mask: Tensor) -> Tensor:
    w = mask.to(hidden.dtype).unsqueeze(-1)  # (B, S, 1)
    return (hidden * w).sum(1) / w.sum(1).clamp_min(1e-9)  # (B, D)


@torch.no_grad()
def probe_sensitivity(
    teacher: nn.Module, fits: Mapping[str, tuple[Tensor, Tensor]], batches: Sequence[Batch]
) -> dict[str, float]:
    """Per ``name: (A, b)``: mean ``1 - cos`` of the pooled embeddings when only that linear
    of (a copy of) the teacher is ``x A^T + b``; the blocks below it are not rerun."""
    scratch = copy.deepcopy(teacher).eval()
    inputs: list[list[Tensor]] = []  # inputs[i][j]: block i's input, batch j (B, S, D)
    masks = [m.bool() for _, m, _ in batches]
    keeps = [m[:, None, None, :] for m in masks]  # (B, 1, 1, S)
    x = embed(scratch, batches)
    blocks = encoder_layers(scratch)
    for block in blocks:
        inputs.append(x)
        x = [run_block(block, h, k) for h, k in zip(x, keeps, strict=True)]
    ref = [_pooled(h, m) for h, m in zip(x, masks, strict=True)]  # (B, D) each
    out: dict[str, float] = {}
    for name, (a, b) in fits.items():
        layer = scratch.get_submodule(name)
        block = _block_of(name)
        saved = layer.weight.data, layer.bias.data
        layer.weight.data = a.to(saved[0].dtype)
        layer.bias.data = b.to(saved[1].dtype)
        try:
            cos, count = 0.0, 0
            for j, (h, k, m) in enumerate(zip(inputs[block], keeps, masks, strict=True)):
                for blk in blocks[block:]:
                    h = run_block(blk, h, k)
                c = F.cosine_similarity(_pooled(h, m), ref[j], dim=-1)  # (B,)
                cos, count = cos + float(c.double().sum()), count + c.numel()
        finally:
            layer.weight.data, layer.bias.data = saved
        out[name] = 1.0 - cos / max(count, 1)
    return out


def plan_ranks(
    model: nn.Module,
    teacher: nn.Module,
    calibration: Sequence[Batch],
    probes: Sequence[Batch],
    *,
    mode: str,
    budget: float,
    caps: Mapping[str, int],
    rounds: int = 1,
    depth_gain: float = 1.0,
) -> tuple[dict[str, int], dict]:
    """``(ranks, info)`` for every ``TTLinear`` of ``model`` (rank <= ``caps[name]``), by
    ``mode`` (``energy`` or ``sensitivity``) within ``budget`` TT entries. The teacher's
    spectra come from the first :data:`PROFILE_SENTENCES` sentences of ``calibration``, the
    sensitivities from ``probes``, scaled by ``depth_gain`` per block (module docstring)."""
    if mode not in ALLOCATIONS[1:]:
        raise ValueError(f"rank_allocation must be one of {list(ALLOCATIONS[1:])}, got {mode!r}")
    layers = {n: m for n, m in model.named_modules() if isinstance(m, TTLinear)}
    stats = teacher_stage_stats(teacher, _first(calibration, PROFILE_SENTENCES))
    profiles = []
    for name, layer in layers.items():
        w = stats[name]
        vals = torch.linalg.eigvalsh(w.m.T @ w.m if w.m.shape[0] >= w.m.shape[1] else w.m @ w.m.T)
        energy = vals.flip(0).clamp_min(0)  # (q,) descending squared singular values
        top = max(1, min(int(caps[name]), energy.numel()))
        costs = tuple(tt_params_at_rank(layer, r) for r in range(top + 1))
        profiles.append(LayerProfile(name, energy, costs))
    r0 = uniform_rank(profiles, budget)
    info: dict = {"rank_allocation": mode, "budget": int(budget), "uniform_rank": r0}
    at = {p.name: min(r0, p.max_rank) for p in profiles}
    scaled = profiles  # the weights the allocation uses (depth-scaled; probed ones unscaled)
    for _ in range(rounds if mode == "sensitivity" else 0):
        profiles, dcos = _reweight(profiles, stats, at, teacher, probes)
        scaled = depth_weighted(profiles, depth_gain)
        at = allocate_ranks(scaled, budget)
        info.setdefault("sensitivity", []).append({n: round(v, 6) for n, v in dcos.items()})
    if mode == "sensitivity":
        info["probe_sentences"] = sum(int(ids.shape[0]) for ids, _, _ in probes)
        info["depth_gain"] = depth_gain
    ranks = allocate_ranks(scaled, budget)
    info["profile_sentences"] = sum(
        int(ids.shape[0]) for ids, _, _ in _first(calibration, PROFILE_SENTENCES)
    )
    info["tt_params"] = sum(p.costs[ranks[p.name]] for p in profiles)
    return ranks, info


def _reweight(
    profiles: Sequence[LayerProfile],
    stats: Mapping[str, Whitened],
    at: Mapping[str, int],
    teacher: nn.Module,
    probes: Sequence[Batch],
) -> tuple[list[LayerProfile], dict[str, float]]:
    """Profiles weighted by the probed ``dcos / eps`` of each layer's fit at rank ``at``."""
    fits = {}
    for p in profiles:
        left, right, bias, _ = solve(stats[p.name], at[p.name])
        fits[p.name] = ((left @ right).T, bias)  # (out, in), (out,)
    dcos = probe_sensitivity(teacher, fits, probes)
    weights = {}
    for p in profiles:
        eps = p.left_out(at[p.name])  # a layer at full rank keeps its earlier weight
        weights[p.name] = max(dcos[p.name], 0.0) / eps if eps > 1e-9 else p.weight
    floor = 1e-6 * max(max(weights.values()), 1e-30)  # a layer measured as free stays cheap
    out = [LayerProfile(p.name, p.energy, p.costs, max(weights[p.name], floor)) for p in profiles]
    return out, dcos


def depth_weighted(profiles: Sequence[LayerProfile], gain: float) -> list[LayerProfile]:
    """``profiles`` with the weight of a layer of block ``i`` (``encoder.layer.<i>.*``, or
    ``encoder.<i>.*``) times ``gain ** i``; other names keep theirs."""
    out = []
    for p in profiles:
        block = _block_of(p.name)
        out.append(LayerProfile(p.name, p.energy, p.costs, p.weight * gain**block))
    return out


def _block_of(name: str) -> int:
    """The block index of ``encoder.layer.<i>.*`` or ``encoder.<i>.*``; 0 for other names."""
    parts = name.removeprefix("encoder.layer.").removeprefix("encoder.").split(".")
    inside = name.startswith("encoder.") and len(parts) > 1 and parts[0].isdigit()
    return int(parts[0]) if inside else 0


def profile_first(calibration: Sequence[Batch], device: torch.device) -> list[Batch]:
    """``calibration`` regrouped by length (:func:`~engine.models.hf_bert.batches.by_length`)
    with its first :data:`PROFILE_SENTENCES` sentences, the ones :func:`plan_ranks` profiles,
    still first."""
    seen = sum(int(ids.shape[0]) for ids, _, _ in calibration)
    head, tail = take_sentences(as_dicts(calibration), PROFILE_SENTENCES, seen, device)
    return by_length(head) + by_length(tail)


def probe_batches(
    probes: Sequence[Batch], calibration: Sequence[Batch], n: int, device: torch.device
) -> tuple[list[Batch], bool]:
    """``(batches, from_calibration)``: the probe sentences regrouped by length, or, when the
    training split had none left after the calibration ones, the first ``n`` of
    ``calibration`` (``from_calibration`` true)."""
    if probes:
        return by_length(probes), False
    return by_length(take_sentences(as_dicts(calibration), n, 0, device)[0]), True


def _first(batches: Sequence[Batch], n: int) -> list[Batch]:
    """The batches holding the first ``n`` sentences (the last one cut)."""
    out, seen = [], 0
    for ids, mask, types in batches:
        if seen >= n:
            break
        take = min(n - seen, int(ids.shape[0]))
        out.append((ids[:take], mask[:take], None if types is None else types[:take]))
        seen += take
    return out
