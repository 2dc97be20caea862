"""Cutting gate entries to a size bound, cheapest loss per parameter first
(docs/method.md#cut-order).

:func:`prune_to_target_` kills (sets to 0.0, below ``tau``) live gate entries until
``S <= target``. Each candidate ``e`` of bond ``k`` costs::

    key(e) = score_e / c_k        c_k = s_k r_{k-1} + s_{k+1} r_{k+1}

``score_e`` is the entry's loss-aware importance (the mean ``|g dL/dg|`` of
:class:`engine.rank.importance.GateImportance`; without scores, ``|g_e|``), and ``c_k`` is the
number of core entries one rank of bond ``k`` controls at the *current* active ranks (``r_0 =
r_K = 1``, ``s`` as in :func:`engine.rank.size.layer_mode_sizes`): killing a non-last entry
of a live layer lowers ``S`` by exactly ``c_k``, so the key is the loss given up per parameter
saved, recomputed as ranks fall. Kills go in three tiers:

1. entries of bonds above their **floor** (``floors``, default 1): no bond is cut below its
   floor while another bond still has slack above its own;
2. when tier 1 is exhausted and ``S`` is still above the target: any bond down to rank 1;
3. when every bond is at rank 1: a whole layer is zeroed (``S`` drops by the layer's size),
   but only a layer named in ``removable``, one with a residual path around it (the
   transformer's FFN); a layer on the only input-to-output path is never cut to rank 0.

If even tier 3 cannot reach the target the plan stops short and the report says
``target_met: false``. Ties go to the lower ``(layer, bond, entry)`` index. Entries of layers
that are already zero are never candidates.

All entries of a bond share ``c_k``, so a bond's next candidate is its lowest-score live
entry. A heap holds one key per bond; when a bond's rank falls, the keys of the bond and its
two neighbours (whose ``c`` changed) are pushed again with a new version and stale keys are
skipped on pop: ``O(E log E)`` for ``E`` gate entries.

This is a host-side operation between steps. Killed entries still hold optimizer momentum:
call :func:`engine.rank.shrink.shrink_model_` right after so they are sliced away.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from engine.rank.size import layer_mode_sizes, model_size, tensorized_layers

__all__ = ["PruneReport", "one_rank_cost", "prune_plan", "prune_to_target_", "rank_floors"]


@dataclass(frozen=True)
class PruneReport:
    """What :func:`prune_to_target_` did; ``per_layer`` counts entries killed per layer,
    ``below_floor`` the kills of tier 2, ``zeroed`` the layers cut to rank 0 (tier 3)."""

    size_before: int
    size_after: int
    target: int
    entries_pruned: int
    per_layer: dict[str, int] = field(default_factory=dict)
    below_floor: int = 0
    zeroed: list[str] = field(default_factory=list)
    target_met: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class _Chain:
    """Host-side state of one live layer: per bond, live entries sorted by ``(score, index)``."""

    def __init__(
        self,
        sizes: tuple[int, ...],
        scores: list[list[float]],
        alive: list[list[bool]],
        floors: Sequence[int],
    ) -> None:
        self.sizes = sizes
        self.order = [
            sorted((v, e) for e, (v, a) in enumerate(zip(vals, live, strict=True)) if a)
            for vals, live in zip(scores, alive, strict=True)
        ]
        self.next = [0] * len(scores)  # per bond: position of the next candidate in ``order``
        self.ranks = [1, *(len(o) for o in self.order), 1]  # active (r_0, ..., r_K)
        self.floors = [max(1, int(f)) for f in floors]
        self.version = [0] * len(scores)
        self.dead = False

    def cost(self, b: int) -> int:
        """``c`` of bond ``b`` (between cores ``b`` and ``b + 1``, 0-based)."""
        return self.sizes[b] * self.ranks[b] + self.sizes[b + 1] * self.ranks[b + 2]

    def size(self) -> int:
        if self.dead or 0 in self.ranks:
            return 0
        return sum(self.ranks[k] * s * self.ranks[k + 1] for k, s in enumerate(self.sizes))

    def key(self, b: int) -> tuple[float, int]:
        """(score per parameter saved, entry) of bond ``b``'s next candidate."""
        score, e = self.order[b][self.next[b]]
        return score / self.cost(b), e

    def layer_key(self) -> float:
        """Cost of zeroing the whole layer: the scores of its last entries per parameter."""
        total = sum(self.order[b][self.next[b]][0] for b in range(len(self.order)))
        return total / max(self.size(), 1)


def _greedy_plan(
    chains: list[_Chain], size: int, target: int, removable: list[bool]
) -> tuple[list[tuple[int, int, int]], int, list[int]]:
    """Kill order ``(layer, bond, entry)`` towards ``size <= target``; mutates chains.
    Returns the plan, how many kills went below a floor and the layers zeroed."""
    heap: list[tuple[float, int, int, int, int]] = []
    floor_tier = True  # tier 1: bonds stay at or above their floors

    def push(l: int, b: int) -> None:
        chain = chains[l]
        if not 0 <= b < len(chain.order) or chain.dead:
            return
        chain.version[b] += 1  # invalidates this bond's older keys either way
        low = chain.floors[b] if floor_tier else 1
        if chain.ranks[b + 1] > low:
            key, e = chain.key(b)
            heapq.heappush(heap, (key, l, b, e, chain.version[b]))

    def push_all() -> None:
        for l, chain in enumerate(chains):
            for b in range(len(chain.order)):
                push(l, b)

    push_all()
    plan: list[tuple[int, int, int]] = []
    below, zeroed = 0, []
    while size > target:
        if heap:
            _, l, b, e, version = heapq.heappop(heap)
            chain = chains[l]
            if version != chain.version[b]:
                continue  # stale key: this bond or a neighbour changed since
            size -= chain.cost(b)
            chain.next[b] += 1
            chain.ranks[b + 1] -= 1
            plan.append((l, b, e))
            below += 0 if floor_tier else 1
            for nb in (b - 1, b, b + 1):
                push(l, nb)
            continue
        if floor_tier:  # tier 2: every bond may go down to rank 1
            floor_tier = False
            push_all()
            continue
        # tier 3: every bond of every live layer is at rank 1: zero the cheapest removable layer
        last = [
            (chain.layer_key(), l)
            for l, chain in enumerate(chains)
            if not chain.dead and removable[l]
        ]
        if not last:
            break  # nothing may be cut further: the target is not met
        _, l = min(last)
        chain = chains[l]
        _, e = chain.order[0][chain.next[0]]
        size -= chain.size()
        chain.dead = True
        chain.ranks[1] -= 1
        plan.append((l, 0, e))
        zeroed.append(l)
    return plan, below, zeroed


def _check_target(target_size: object) -> int:
    if isinstance(target_size, bool) or not isinstance(target_size, int) or target_size < 0:
        raise ValueError(f"target_size must be a non-negative integer, got {target_size!r}")
    return target_size


def rank_floors(model: nn.Module, fraction: float) -> dict[str, tuple[int, ...]]:
    """Per layer, per bond: ``max(1, ceil(fraction * active rank))`` at the current ranks."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    return {
        name: tuple(max(1, math.ceil(fraction * r)) for r in mod.active_ranks()[1:-1])
        for name, mod in tensorized_layers(model)
    }


def one_rank_cost(model: nn.Module) -> int | None:
    """The fewest core entries one kill removes: the least ``c_k`` over the bonds of live
    layers whose active rank is above 1 (``None``: no such bond, nothing may be cut)."""
    best: int | None = None
    for _, mod in tensorized_layers(model):
        ranks = list(mod.active_ranks())  # (r_0, ..., r_K)
        if 0 in ranks:
            continue
        sizes = layer_mode_sizes(mod)
        for b in range(len(ranks) - 2):
            if ranks[b + 1] > 1:
                cost = sizes[b] * ranks[b] + sizes[b + 1] * ranks[b + 2]
                best = cost if best is None else min(best, cost)
    return best


def _layers(
    model: nn.Module,
    scores: Mapping[str, Sequence[Tensor]] | None,
    floors: Mapping[str, Sequence[int]] | None,
) -> tuple[list[_Chain], list[str]]:
    chains, names = [], []
    for name, mod in tensorized_layers(model):
        gates = [g.detach() for g in mod.gates]
        if scores is None:
            values = [g.double().abs().cpu().tolist() for g in gates]
        else:
            values = [s.detach().double().cpu().tolist() for s in scores[name]]
        alive = [(g > mod.gate_threshold).cpu().tolist() for g in gates]  # torch's own test
        low = floors.get(name, ()) if floors is not None else ()
        bonds = len(gates)
        chain = _Chain(layer_mode_sizes(mod), values, alive, [*low, *[1] * bonds][:bonds])
        if chain.size() > 0:  # layers that are already zero are never candidates
            chains.append(chain)
            names.append(name)
    return chains, names


def prune_plan(
    model: nn.Module,
    target_size: int,
    *,
    scores: Mapping[str, Sequence[Tensor]] | None = None,
    floors: Mapping[str, Sequence[int]] | None = None,
    removable: Collection[str] = (),
) -> list[tuple[str, int, int]]:
    """The kills ``(layer name, bond, entry)``, in order, that :func:`prune_to_target_` applies.

    A dry run: the model is not changed. ``scores``: per layer, one tensor per gate vector
    (``None``: ``|g|``); ``floors``: per layer, the tier-1 floor of each bond; ``removable``:
    names of the layers that may be zeroed.
    """
    return _plan(model, target_size, scores, floors, removable)[0]


def _plan(model, target_size, scores, floors, removable):
    _check_target(target_size)
    chains, names = _layers(model, scores, floors)
    flags = [n in removable for n in names]
    plan, below, zeroed = _greedy_plan(chains, model_size(model), target_size, flags)
    return [(names[l], b, e) for l, b, e in plan], below, [names[l] for l in zeroed]


def prune_to_target_(
    model: nn.Module,
    target_size: int,
    *,
    scores: Mapping[str, Sequence[Tensor]] | None = None,
    floors: Mapping[str, Sequence[int]] | None = None,
    removable: Collection[str] = (),
) -> PruneReport:
    """Kill gate entries in key order until ``model_size(model) <= target_size`` (or nothing
    may be cut further: ``target_met`` false). Arguments as :func:`prune_plan`."""
    before = model_size(model)
    plan, below, zeroed = _plan(model, target_size, scores, floors, removable)
    modules = dict(tensorized_layers(model))
    per_layer: dict[str, int] = {}
    kills: dict[tuple[str, int], list[int]] = {}
    for name, b, e in plan:
        kills.setdefault((name, b), []).append(e)
        per_layer[name] = per_layer.get(name, 0) + 1
    with torch.no_grad():
        for (name, b), entries in kills.items():
            gate = modules[name].gates[b]
            gate.index_fill_(0, torch.tensor(entries, device=gate.device), 0.0)
    after = model_size(model)
    met = after <= target_size
    return PruneReport(before, after, target_size, len(plan), per_layer, below, zeroed, met)
