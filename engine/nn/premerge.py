"""Premerge sessions: the cores of same-shaped TT-linears merged once per forward, batched.

Inside ``with PremergeSession(layers):`` (opened by :class:`engine.train.fast_path.FastPath`
around a model forward) a :class:`~engine.nn.tt_linear.TTLinear` whose fused plan runs on torch
ops takes its halves ``L``, ``R`` from one :class:`engine.contract.batched.GroupMergeFunction`
call per *group* (members with equal core shapes, threshold, dtype and device; at least two),
made when the first member is called, and runs only the products
(:mod:`engine.contract.premerged`). The FFN block (:func:`engine.nn.feed_forward.tt_feed_forward`)
does the same with both of its layers, and self-attention whose q, k, v and output projections
are all grouped (:func:`premerged_attention`) runs in their rank space
(:mod:`engine.contract.lowrank_attention`).

*Siblings*: layers of one group called one after the other on the very same input tensor
(attention's q, k, v) are recorded; from the next session on, the first call computes all of
them with :class:`~engine.contract.premerged.SiblingLinearFunction` and the others' outputs
wait for their call, used only if it comes with the same tensor, unchanged. So a sibling set
learned wrongly costs time, never correctness.

Anything the session does not cover (no session, a singleton, another plan, the Triton
backend, ``activation`` on a sibling) returns ``None`` and the layer runs its own path. The
maths is that path's, with other GEMM groupings: equal in float64, to rounding in float32.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from engine.contract.batched import GroupMergeFunction, GroupSpec, padded_rank
from engine.contract.execute import with_bias
from engine.contract.lowrank_attention import (
    AttentionGeometry,
    LowRankAttentionFunction,
    attention_factors,
    lowrank_pays,
)
from engine.contract.lowrank_saved import recomputing
from engine.contract.plan import Plan, Side, plan_tt_linear
from engine.contract.premerged import (
    PremergedFFNFunction,
    PremergedLinearFunction,
    SiblingLinearFunction,
)
from engine.kernels.backend import resolve_backend
from engine.nn.functional import parse_plan, problem_for

__all__ = [
    "PremergeSession",
    "active_session",
    "premerged_attention",
    "premerged_linear",
    "premerged_ffn",
]

_local = threading.local()
MIN_GROUP = 2  # a group of one merges as the layer itself would (but see autocast below)


def active_session() -> PremergeSession | None:
    """The session open in this thread, if any."""
    return getattr(_local, "session", None)


def premerged_linear(layer: Any, x: Tensor, activation: str | None) -> Tensor | None:
    """``layer(x)`` through the open session, or ``None`` (the layer runs its own path)."""
    session = active_session()
    return None if session is None else session.linear(layer, x, activation)


def premerged_ffn(
    x2: Tensor, fc1: Any, fc2: Any, plan1: Plan, plan2: Plan, block: int
) -> Tensor | None:
    """``fc2(gelu(fc1(x2)))`` through the open session, or ``None``."""
    session = active_session()
    return None if session is None else session.ffn(x2, fc1, fc2, plan1, plan2, block)


def premerged_attention(
    x: Tensor,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    heads: int,
    keep: Tensor | None,
    p: float,
    keep_probs: bool,
) -> Tensor | None:
    """``out(attention(q(x), k(x), v(x)))`` in rank space through the open session, or
    ``None`` (the caller runs the standard path); see :meth:`PremergeSession.attention`."""
    session = active_session()
    if session is None:
        return None
    return session.attention(x, (q, k, v, out), heads, keep, p, keep_probs)


def _signature(layer: Any) -> tuple | None:
    cores = list(layer.cores)
    if any(c.numel() == 0 for c in cores):
        return None  # a bond cut to rank 0: the layer's own path returns zeros
    c0 = cores[0]
    return (
        tuple(layer.in_modes),
        tuple(layer.out_modes),
        layer.in_features,
        layer.out_features,
        float(layer.gate_threshold),
        tuple(c.shape for c in cores),
        c0.dtype,
        c0.device,
        str(layer.kernel),
    )


class _Merged(NamedTuple):
    dirs: tuple[Side, Side]
    left: tuple[Tensor, ...]  # G views (N, r)
    right: tuple[Tensor, ...]  # G views (r, M)


class PremergeSession:
    """Group merges for one forward of the given TT-linears (a context manager).

    ``siblings`` maps ``id(first layer)`` to the ids of a sibling run (see the module doc);
    :meth:`learned_siblings` gives the runs observed in this session, for the next one.
    """

    def __init__(
        self, layers: Sequence[nn.Module], siblings: dict[int, tuple[int, ...]] | None = None
    ) -> None:
        by_sig: dict[tuple, list[nn.Module]] = {}
        for layer in layers:
            sig = _signature(layer)
            if sig is not None:
                by_sig.setdefault(sig, []).append(layer)
        first = next((p for m in layers for p in m.parameters()), None)
        # under autocast every fused layer goes through the session: the autocast-aware path
        amp = first is not None and torch.is_autocast_enabled(first.device.type)
        least = 1 if amp else MIN_GROUP
        self.groups = [g for g in by_sig.values() if len(g) >= least]
        self.where = {
            id(m): (gi, pos) for gi, g in enumerate(self.groups) for pos, m in enumerate(g)
        }
        self.siblings = dict(siblings or {})
        self.merged: dict[int, _Merged] = {}
        self.pending: dict[int, tuple[Tensor, int, Tensor]] = {}
        self.calls: list[tuple[nn.Module, Tensor]] = []
        self.stats = {"linear": 0, "sibling_runs": 0, "ffn": 0, "attention": 0}  # calls served
        self._outer: PremergeSession | None = None

    def __enter__(self) -> PremergeSession:
        self._outer = active_session()
        _local.session = self
        return self

    def __exit__(self, *exc: object) -> None:
        _local.session = self._outer
        self.pending.clear()

    # -- halves -------------------------------------------------------------------------
    def _dirs(self, layer: Any, x2: Tensor) -> tuple[Side, Side] | None:
        plan = parse_plan(layer.plan)
        if plan == "reference":
            return None
        if plan == "auto":
            plan = plan_tt_linear(problem_for(x2, list(layer.cores), layer.bias, layer.meta))
        if not plan.fused:
            return None
        tensors = (x2, *layer.cores, *layer.gates)
        if resolve_backend(layer.kernel, *tensors) != "torch":
            return None
        return plan.input_side, plan.output_side

    def _entry(self, layer: Any, dirs: tuple[Side, Side], rows: int) -> tuple[_Merged, int] | None:
        where = self.where.get(id(layer))
        if where is None:
            return None
        gi, pos = where
        entry = self.merged.get(gi)
        if entry is None:
            entry = self.merged[gi] = self._merge(self.groups[gi], dirs, rows)
        return (entry, pos) if entry.dirs == dirs else None

    @staticmethod
    def _merge(members: list[nn.Module], dirs: tuple[Side, Side], rows: int) -> _Merged:
        """The group's halves, the middle bond zero-padded for products over ``rows`` rows
        (:func:`engine.contract.batched.padded_rank`)."""
        first: Any = members[0]
        d = len(first.in_modes)
        rank_to = padded_rank(first.cores[d].shape[0], rows)
        spec = GroupSpec(
            d,
            first.in_features,
            first.out_features,
            float(first.gate_threshold),
            dirs,
            len(members),
            rank_to,
        )
        params = [p for m in members for p in (*m.cores, *m.gates)]  # type: ignore[attr-defined]
        lefts, rights = GroupMergeFunction.apply(spec, *params)  # (G, N, r), (G, r, M)
        return _Merged(dirs, lefts.unbind(0), rights.unbind(0))

    # -- layers -------------------------------------------------------------------------
    def linear(self, layer: Any, x: Tensor, activation: str | None) -> Tensor | None:
        self.calls.append((layer, x))  # every call, grouped or not: what siblings are learned from
        if id(layer) not in self.where or x.dim() == 0 or x.shape[-1] != layer.in_features:
            return None  # not grouped (or a bad input: the layer raises its own error)
        lead = x.shape[:-1]
        hit = self.pending.pop(id(layer), None)
        if hit is not None and hit[0] is x and hit[1] == x._version and activation is None:
            return hit[2]
        x2 = x.reshape(-1, layer.in_features)  # (B, N)
        dirs = self._dirs(layer, x2)
        found = None if dirs is None else self._entry(layer, dirs, x2.shape[0])
        if found is None:
            return None
        entry, pos = found
        self.stats["linear"] += 1
        run = self._sibling_run(layer, pos)
        if run is not None and activation is None and not recomputing():
            return self._siblings(run, entry, pos, x, x2, lead)
        y = PremergedLinearFunction.apply(
            x2, entry.left[pos], entry.right[pos], layer.bias, activation
        )  # (B, M)
        return y.reshape(*lead, layer.out_features)

    def ffn(
        self, x2: Tensor, fc1: Any, fc2: Any, plan1: Plan, plan2: Plan, block: int
    ) -> Tensor | None:
        rows = x2.shape[0]
        e1 = self._entry(fc1, (plan1.input_side, plan1.output_side), rows)
        e2 = self._entry(fc2, (plan2.input_side, plan2.output_side), rows)
        if e1 is None or e2 is None:
            return None
        (m1, p1), (m2, p2) = e1, e2
        self.stats["ffn"] += 1
        return PremergedFFNFunction.apply(
            x2, m1.left[p1], m1.right[p1], fc1.bias, m2.left[p2], m2.right[p2], fc2.bias, block
        )  # (B, D)

    def attention(
        self,
        x: Tensor,
        layers: tuple[Any, Any, Any, Any],
        heads: int,
        keep: Tensor | None,
        p: float,
        keep_probs: bool,
    ) -> Tensor | None:
        """Self-attention of ``x (B, S, D)`` with TT-linear projections ``(q, k, v, out)`` in
        rank space (:mod:`engine.contract.lowrank_attention`): (B, S, D) before the output
        dropout, or ``None`` when that does not apply. It applies when gradients are recorded
        on a CPU tensor without autocast (the standard path's unfused attention; elsewhere
        torch's fused kernels), all four layers are grouped with fused torch plans, and the
        cost model says it takes fewer multiply-adds."""
        if x.dim() != 3 or x.device.type != "cpu" or not torch.is_grad_enabled():
            return None
        if torch.is_autocast_enabled("cpu") or any(id(m) not in self.where for m in layers):
            return None
        b, s, d = x.shape
        if any(m.in_features != d or m.out_features != d for m in layers) or d % heads:
            return None
        x2 = x.reshape(b * s, d)  # (n, D)
        halves = []
        for layer in layers:
            dirs = self._dirs(layer, x2)
            found = None if dirs is None else self._entry(layer, dirs, x2.shape[0])
            if found is None:
                return None
            entry, pos = found
            halves.append((entry.left[pos], entry.right[pos]))  # (D, r), (r, D)
        (lq, rq), (lk, rk), (lv, rv), (lo, ro) = halves
        q, k, v, out = layers
        save_probs = keep_probs or not recomputing()  # as AttentionFunction decides
        geo = AttentionGeometry(b, s, heads, p, save_probs, out_ones=out.bias is not None)
        ranks = (lq.shape[1], lk.shape[1], lv.shape[1], lo.shape[1])
        biases = (q.bias is not None, k.bias is not None, v.bias is not None)
        if not lowrank_pays(b * s, geo, d, ranks, biases):
            return None
        self.stats["attention"] += 1
        c, w = attention_factors(rq, rk, rv, q.bias, v.bias, lo, heads)  # small, autograd
        u = LowRankAttentionFunction.apply(x2, lq, lk, lv, c, w, k.bias, keep, geo)  # (n, r_o [+1])
        y = u @ with_bias(ro, out.bias)  # (n, D)
        return y.view(b, s, d)

    # -- siblings -----------------------------------------------------------------------
    def _sibling_run(self, layer: Any, pos: int) -> list[nn.Module] | None:
        """The longest prefix of ``layer``'s learned run that sits at consecutive positions of
        its group (a pure function of the run and the current groups: after a shrink a run
        may split, the same way in a resumed job as in the uninterrupted one)."""
        ids = self.siblings.get(id(layer))
        if ids is None:
            return None
        group = self.groups[self.where[id(layer)][0]]
        n = 1
        while (
            n < len(ids)
            and pos + n < len(group)
            and id(group[pos + n]) == ids[n]
            and (
                (group[pos + n].bias is None) == (layer.bias is None)  # type: ignore[attr-defined]
            )
        ):
            n += 1
        return group[pos : pos + n] if n >= 2 else None

    def _siblings(
        self,
        run: list[nn.Module],
        entry: _Merged,
        pos: int,
        x: Tensor,
        x2: Tensor,
        lead: torch.Size,
    ) -> Tensor:
        S = len(run)
        self.stats["sibling_runs"] += 1
        biases = None
        if run[0].bias is not None:  # type: ignore[attr-defined]
            biases = torch.stack([m.bias for m in run])  # type: ignore[attr-defined]  # (S, M)
        # stacked from the unbound views (slicing the group's outputs instead would cost a
        # zero-filled (G, N, r) gradient per run in backward)
        lefts = torch.stack(entry.left[pos : pos + S])  # (S, N, r)
        rights = torch.stack(entry.right[pos : pos + S])  # (S, r, M)
        ys = SiblingLinearFunction.apply(x2, lefts, rights, biases)  # (S, B, M)
        outs = [y.view(*lead, y.shape[-1]) for y in ys.unbind(0)]  # (..., M) each
        for m, y in zip(run[1:], outs[1:], strict=True):
            self.pending[id(m)] = (x, x._version, y)
        return outs[0]

    def learned_siblings(self) -> dict[int, tuple[int, ...]]:
        """Runs of layers called one after the other on one input tensor, whatever their
        groups: every member but the last maps to the rest of its run (``(q, k, v)`` gives
        ``q -> (q, k, v)`` and ``k -> (k, v)``)."""
        runs: dict[int, tuple[int, ...]] = {}
        i = 0
        while i < len(self.calls):
            x = self.calls[i][1]
            j = i + 1
            while j < len(self.calls) and self.calls[j][1] is x:
                j += 1
            ids = tuple(id(m) for m, _ in self.calls[i:j])
            for k in range(j - i - 1):
                runs[ids[k]] = ids[k:]
            i = j
        return runs
