"""Differentiable rank penalties ``R(g)`` and the on-device size ``S``, from one flat gate index.

Notation: layer ``l`` has ``K`` cores with mode sizes ``s_k`` (:func:`layer_mode_sizes`), dense
size ``D_l`` (``dense_parameters()``), threshold ``tau_l`` and one gate vector per internal bond
``k = 1..K-1``. ``mu(g) = g * 1[g > tau]``; ``r_k = #{g_k > tau}`` (``r_0 = r_K = 1``). A layer
is *live* when all its ``r_k > 0``; a layer with a dead bond is identically zero (its size is 0
and it is cut to rank 0 at the next shrink). An entry is *active* when ``g > tau`` **and** its
layer is live; sums over ``e`` run over active entries.

Entries left in a zero layer are not active: they no longer control any parameter (the exact
gradient of ``S`` with respect to them is 0) and the next shrink removes them, so excluding them
keeps ``R``, its gradient and :meth:`GateIndex.active_entries` unchanged by a shrink, as
docs/method.md#physical-shrinking requires. (The released code never shrinks and would still
count them; this is the only departure from its ``uniform`` formula, and it only matters once a
whole bond has died.)

``uniform`` (the authors' code, docs/method.md#rank-penalties)::

    R = sum_e mu(g_e) / N                     N = #active entries (a constant: no gradient)

``cost_weighted`` (the default). Killing one rank of bond ``k`` removes
``c_k = s_k r_{k-1} + s_{k+1} r_{k+1}`` entries from its two neighbouring cores, so entry ``e`` of
bond ``k`` of layer ``l`` gets the weight ``w_e = c_k / D_l`` (parameters controlled, per dense
parameter of its layer) and::

    R = sum_e w_e mu(g_e) / sum_e w_e         (the denominator is a constant: no gradient)

so ``R = 1`` when every gate is 1, as for ``uniform``, and ``dR/dg_e = w_e / sum w`` for an active
entry, 0 for any other. ``w`` is piecewise constant in ``g``; it is recomputed from the current
active ranks on every call. If nothing is active ``R = 0``.

Everything runs on the gates' device with no host synchronisation (no ``.item()``, no
data-dependent shapes): one ``torch.cat`` of all gates, a threshold, ``index_add_`` segment counts
and gathers through index tensors cached by :meth:`GateIndex.refresh`. This runs every training
step and inside CUDA graphs. :meth:`GateIndex.size` computes the exact size model ``S`` of
:mod:`engine.rank.size` the same way (int64, returned as float64)::

    S = sum_l 1[all r_k > 0] * sum_k r_{k-1} s_k r_k

Call :meth:`GateIndex.refresh` after any shrink (gate vectors change length) and never inside a
capture; a stale index raises instead of computing garbage.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.configs import ConfigError
from engine.rank.size import layer_mode_sizes, tensorized_layers

__all__ = ["PENALTIES", "GateIndex"]

PENALTIES = ("uniform", "cost_weighted")


class GateIndex:
    """Flat view of every rank gate of ``model``: penalty ``R``, size ``S`` and active count."""

    def __init__(self, model: nn.Module, variant: str = "cost_weighted") -> None:
        if variant not in PENALTIES:
            raise ConfigError("compression.penalty", f"must be one of {PENALTIES}, got {variant!r}")
        self.model = model
        self.variant = variant
        self.floors: dict[str, tuple[int, ...]] = {}  # see protect()
        self.refresh()

    def protect(self, floors: dict[str, tuple[int, ...]] | None) -> None:
        """Exempt from the penalty the ``floors[layer][k]`` largest live entries of each bond
        ``k`` (``None``: no exemption), so the penalty alone can never push a bond below its
        floor (a whole layer to zero). Kept across :meth:`refresh`."""
        self.floors = dict(floors or {})
        self.refresh()

    # -- index ----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Rebuild the cached index tensors from the model's current gates and cores.

        Layout: entries ``e`` (all gate entries, layer by layer, bond by bond), bonds ``b``,
        cores ``c`` and *rank slots*: per layer ``K + 1`` slots holding ``(1, r_1..r_{K-1}, 1)``.
        """
        gates: list[nn.Parameter] = []
        entry_bond: list[int] = []
        entry_tau: list[float] = []
        bond_layer: list[int] = []
        bond_slot: list[int] = []
        bond_s_left: list[int] = []
        bond_s_right: list[int] = []
        bond_dense: list[int] = []
        core_slot: list[int] = []
        core_s: list[int] = []
        core_layer: list[int] = []
        bond_floor: list[int] = []
        slots = 0
        named = tensorized_layers(self.model)
        layers = [m for _, m in named]
        for l, (name, mod) in enumerate(named):
            sizes = layer_mode_sizes(mod)
            floors = self.floors.get(name, ())
            bond_floor.extend(int(f) for f in (*floors, *[0] * len(mod.gates))[: len(mod.gates)])
            for k, s in enumerate(sizes):  # core k sits between slots k and k + 1
                core_slot.append(slots + k)
                core_s.append(s)
                core_layer.append(l)
            for k, g in enumerate(mod.gates):  # bond k: between cores k and k + 1, slot k + 1
                b = len(bond_layer)
                gates.append(g)
                entry_bond.extend([b] * g.numel())
                entry_tau.extend([mod.gate_threshold] * g.numel())
                bond_layer.append(l)
                bond_slot.append(slots + k + 1)
                bond_s_left.append(sizes[k])
                bond_s_right.append(sizes[k + 1])
                bond_dense.append(mod.dense_parameters())
            slots += len(sizes) + 1
        first = gates[0] if gates else next(iter(self.model.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
        dtype = first.dtype if first is not None else torch.get_default_dtype()

        def idx(values: list[int]) -> Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        def flt(values: list[float] | list[int]) -> Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        self._gates = gates
        self._shapes = tuple(g.numel() for g in gates)
        self._device, self._dtype = device, dtype
        self._num_layers, self._num_bonds, self._num_slots = len(layers), len(bond_layer), slots
        self._entry_bond, self._entry_tau = idx(entry_bond), flt(entry_tau)
        self._entry_layer = idx([bond_layer[b] for b in entry_bond])
        self._bond_layer, self._bond_slot = idx(bond_layer), idx(bond_slot)
        self._bond_s_left, self._bond_s_right = flt(bond_s_left), flt(bond_s_right)
        self._bond_dense = flt(bond_dense)
        self._core_slot, self._core_s = idx(core_slot), idx(core_s)
        self._core_layer = idx(core_layer)
        self._bond_floor = idx(bond_floor)  # (B,)
        starts = [0]
        for g in gates:
            starts.append(starts[-1] + g.numel())
        self._bond_start = idx(starts[:-1])  # (B,) first entry of each bond
        self._protected = any(bond_floor)

    def _flat(self) -> Tensor:
        if tuple(g.numel() for g in self._gates) != self._shapes:
            raise RuntimeError(
                "GateIndex is stale: the gates changed shape (a shrink?); call refresh() first"
            )
        if not self._gates:
            return torch.zeros(0, dtype=self._dtype, device=self._device)  # (0,)
        if self._gates[0].device != self._device:  # the model moved: move the index with it
            self.refresh()
        # gates are vectors: cat them as they are (a reshape would add a view node per gate)
        return torch.cat([g if g.dim() == 1 else g.reshape(-1) for g in self._gates])  # (E,)

    def _state(self, flat: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Active mask (E,), rank slots (N,) ``(1, r_1..r_{K-1}, 1)`` and live layers (L,)."""
        above = flat.detach() > self._entry_tau  # (E,)
        counts = torch.zeros(self._num_bonds, dtype=torch.long, device=self._device)
        counts = counts.index_add(0, self._entry_bond, above.long())  # (B,) r_k
        ones = torch.ones(self._num_slots, dtype=torch.long, device=self._device)
        ranks = ones.index_copy(0, self._bond_slot, counts)  # (N,)
        zeros = torch.zeros(self._num_layers, dtype=torch.long, device=self._device)
        dead_bonds = zeros.index_add(0, self._bond_layer, (counts == 0).long())  # (L,)
        live = dead_bonds == 0  # (L,)
        active = above & live.index_select(0, self._entry_layer)  # (E,)
        return active, ranks, live

    def _penalized(self, flat: Tensor, active: Tensor) -> Tensor:
        """Active entries the penalty acts on (E,): all, minus the protected largest ones."""
        if not self._protected:
            return active
        values = torch.where(active, flat.detach(), torch.full_like(flat, -torch.inf))  # (E,)
        by_value = torch.argsort(values, descending=True, stable=True)  # (E,)
        by_bond = torch.argsort(self._entry_bond.index_select(0, by_value), stable=True)
        perm = by_value.index_select(0, by_bond)  # (E,) bond by bond, largest first
        bond = self._entry_bond.index_select(0, perm)  # (E,)
        pos = torch.arange(perm.numel(), device=self._device) - self._bond_start[bond]  # (E,)
        kept = pos < self._bond_floor.index_select(0, bond)  # (E,) in perm order
        exempt = torch.zeros_like(kept).scatter(0, perm, kept)  # (E,)
        return active & ~exempt

    def _weights(self, ranks: Tensor) -> Tensor:
        """Weight of every entry (E,) at the given rank slots."""
        if self.variant == "uniform":
            return torch.ones(self._entry_bond.shape, dtype=self._dtype, device=self._device)
        left = ranks.index_select(0, self._bond_slot - 1).to(self._dtype)  # (B,) r_{k-1}
        right = ranks.index_select(0, self._bond_slot + 1).to(self._dtype)  # (B,) r_{k+1}
        cost = self._bond_s_left * left + self._bond_s_right * right  # (B,) c_k
        return (cost / self._bond_dense).index_select(0, self._entry_bond)  # (E,) w_e

    # -- public ---------------------------------------------------------------------------
    def entry_weights(self) -> Tensor:
        """Weight of every gate entry (E,): ``c_k / D_l`` (``cost_weighted``) or 1 (``uniform``).

        Inactive entries get their bond's weight too; the penalty masks them.
        """
        _, ranks, _ = self._state(self._flat())
        return self._weights(ranks)  # (E,)

    def penalty(self) -> Tensor:
        """``R(g)`` as a () tensor, differentiable w.r.t. every gate (see the module docstring)."""
        flat = self._flat()  # (E,)
        active, ranks, _ = self._state(flat)  # (E,), (N,)
        active = self._penalized(flat, active)  # (E,)
        mu = torch.where(active, flat, torch.zeros_like(flat))  # (E,) dmu/dg = 1[active]
        w = self._weights(ranks) * active  # (E,) active weights, no gradient
        den = w.sum().detach()  # ()
        num = (w * mu).sum()  # ()
        return num / torch.where(den > 0, den, torch.ones_like(den))  # () 0 if nothing active

    def penalty_grad(self) -> Tensor:
        """``dR/dg`` of every gate entry (E,), as autograd gives it for :meth:`penalty`:
        ``w_e / sum(w)`` for an active entry, 0 for any other. No graph, no host sync."""
        flat = self._flat().detach()  # (E,)
        active, ranks, _ = self._state(flat)  # (E,), (N,)
        w = self._weights(ranks) * self._penalized(flat, active)  # (E,)
        den = w.sum()  # ()
        return w / torch.where(den > 0, den, torch.ones_like(den))  # (E,)

    def gates(self) -> list[nn.Parameter]:
        """The gate vectors, in index order."""
        return list(self._gates)

    def values(self) -> Tensor:
        """Every gate entry (E,), detached, in index order (layer, bond, entry)."""
        return self._flat().detach()

    def grads(self) -> Tensor:
        """The gradient of every gate entry (E,) after a backward (0 where a gate has none)."""
        flat = self._flat()  # raises when stale
        if not self._gates:
            return flat
        return torch.cat([torch.zeros_like(g) if g.grad is None else g.grad for g in self._gates])

    def split(self, flat: Tensor) -> list[Tensor]:
        """A per-entry vector (E,) cut into one piece per gate vector, in model order."""
        return list(torch.split(flat, self._shapes))

    def size(self) -> Tensor:
        """``S`` at the active ranks as a () float64 tensor, equal to ``model_size(model)``."""
        _, ranks, live = self._state(self._flat())  # (N,), (L,)
        left = ranks.index_select(0, self._core_slot)  # (C,) r_{k-1}
        right = ranks.index_select(0, self._core_slot + 1)  # (C,) r_k
        per_core = left * self._core_s * right  # (C,)
        zeros = torch.zeros(self._num_layers, dtype=torch.long, device=self._device)
        per_layer = zeros.index_add(0, self._core_layer, per_core)  # (L,)
        return (per_layer * live).sum().to(torch.float64)  # ()

    def active_entries(self) -> Tensor:
        """Active gate entries (above ``tau``, in a live layer) as a () int64 tensor."""
        active, _, _ = self._state(self._flat())
        return active.sum()  # ()
