"""Meeting the size target: greedy pruning of the least important gate entries (Part B item 5).

The late stage does not guarantee ``S <= S*`` (method doc §4.3). :func:`prune_to_target_` closes
the gap. While ``S > target`` it kills (sets to 0.0, below ``tau``) the live gate entry with the
lowest importance::

    importance(e) = |g_e| * c_k        c_k = s_k r_{k-1} + s_{k+1} r_{k+1}

where ``c_k`` is the number of core entries one rank of bond ``k`` controls at the *current*
active ranks (``r_0 = r_K = 1``, ``s`` as in :func:`engine.rank.size.layer_mode_sizes`), so costs
are recomputed as ranks fall. Killing a non-last entry of bond ``k`` of a live layer lowers ``S``
by exactly ``c_k``. The last live entry of a bond is never taken while any other candidate is
left; only when every bond of every live layer is down to rank 1 are last entries considered
(same importance), and taking one zeroes its whole layer (``S`` drops by the layer's size).
Entries of layers that are already zero are never candidates. Ties go to the lower
``(layer, bond, entry)`` index. The loop always ends with ``S <= target``.

Every entry of a bond shares ``c_k``, so a bond's next candidate is its smallest live ``|g|``. A
heap holds one key per bond; when a bond's rank falls, the keys of the bond and its two
neighbours (whose ``c`` changed) are pushed again with a new version and stale keys are skipped
on pop: ``O(E log E)`` for ``E`` gate entries.

This is a host-side operation between steps. Killed entries still hold optimizer momentum: call
:func:`engine.rank.shrink.shrink_model_` right after so they are sliced away.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from engine.rank.size import layer_mode_sizes, model_size, tensorized_layers

__all__ = ["PruneReport", "prune_plan", "prune_to_target_"]


@dataclass(frozen=True)
class PruneReport:
    """What :func:`prune_to_target_` did; ``per_layer`` counts entries killed per layer."""

    size_before: int
    size_after: int
    target: int
    entries_pruned: int
    per_layer: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class _Chain:
    """Host-side state of one live layer: per bond, live entries sorted by ``(|g|, index)``."""

    def __init__(
        self, sizes: tuple[int, ...], values: list[list[float]], alive: list[list[bool]]
    ) -> None:
        self.sizes = sizes
        self.order = [
            sorted((abs(v), e) for e, (v, a) in enumerate(zip(vals, live, strict=True)) if a)
            for vals, live in zip(values, alive, strict=True)
        ]
        self.next = [0] * len(values)  # per bond: position of the next candidate in ``order``
        self.ranks = [1, *(len(o) for o in self.order), 1]  # active (r_0, ..., r_K)
        self.version = [0] * len(values)
        self.dead = False

    def cost(self, b: int) -> int:
        """``c`` of bond ``b`` (between cores ``b`` and ``b + 1``, 0-based)."""
        return self.sizes[b] * self.ranks[b] + self.sizes[b + 1] * self.ranks[b + 2]

    def size(self) -> int:
        if self.dead or 0 in self.ranks:
            return 0
        return sum(self.ranks[k] * s * self.ranks[k + 1] for k, s in enumerate(self.sizes))

    def key(self, b: int) -> tuple[float, int]:
        """(importance, entry) of bond ``b``'s next candidate."""
        mag, e = self.order[b][self.next[b]]
        return mag * self.cost(b), e


def _greedy_plan(chains: list[_Chain], size: int, target: int) -> list[tuple[int, int, int]]:
    """Kill order ``(layer, bond, entry)`` bringing ``size`` to ``<= target``; mutates chains."""
    heap: list[tuple[float, int, int, int, int]] = []

    def push(l: int, b: int) -> None:
        chain = chains[l]
        if 0 <= b < len(chain.order) and not chain.dead and chain.ranks[b + 1] > 1:
            chain.version[b] += 1
            imp, e = chain.key(b)
            heapq.heappush(heap, (imp, l, b, e, chain.version[b]))

    for l, chain in enumerate(chains):
        for b in range(len(chain.order)):
            push(l, b)
    plan: list[tuple[int, int, int]] = []
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
            for nb in (b - 1, b, b + 1):
                push(l, nb)
            continue
        # every bond of every live layer is at rank 1: zero the layer of the cheapest last entry
        last = [
            (chain.key(b)[0], l, b, chain.key(b)[1])
            for l, chain in enumerate(chains) if not chain.dead
            for b in range(len(chain.order))
        ]
        if not last:
            break  # nothing left to prune (size is 0 here)
        _, l, b, e = min(last)
        size -= chains[l].size()
        chains[l].dead = True
        chains[l].ranks[b + 1] -= 1
        plan.append((l, b, e))
    return plan


def _check_target(target_size: object) -> int:
    if isinstance(target_size, bool) or not isinstance(target_size, int) or target_size < 0:
        raise ValueError(f"target_size must be a non-negative integer, got {target_size!r}")
    return target_size


def prune_plan(model: nn.Module, target_size: int) -> list[tuple[str, int, int]]:
    """The kills ``(layer name, bond, entry)``, in order, that :func:`prune_to_target_` applies.

    A dry run: the model is not changed.
    """
    _check_target(target_size)
    chains, names = [], []
    for name, mod in tensorized_layers(model):
        gates = [g.detach() for g in mod.gates]
        values = [g.double().cpu().tolist() for g in gates]
        alive = [(g > mod.gate_threshold).cpu().tolist() for g in gates]  # torch's own test
        chain = _Chain(layer_mode_sizes(mod), values, alive)
        if chain.size() > 0:  # layers that are already zero are never candidates
            chains.append(chain)
            names.append(name)
    plan = _greedy_plan(chains, model_size(model), target_size)
    return [(names[l], b, e) for l, b, e in plan]


def prune_to_target_(model: nn.Module, target_size: int) -> PruneReport:
    """Kill gate entries in importance order until ``model_size(model) <= target_size``."""
    before = model_size(model)
    plan = prune_plan(model, target_size)
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
    if after > target_size:  # cannot happen: the plan's size bookkeeping is exact
        raise RuntimeError(f"pruning left size {after} > target {target_size}")
    return PruneReport(before, after, target_size, len(plan), per_layer)
