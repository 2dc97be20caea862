"""``max_rank: "auto"``: each TT layer's rank from a short dense calibration run
(docs/method.md#automatic-rank).

The rule, per TT-linear with modes ``(n_1..n_d) -> (m_1..m_e)``: take the weight ``W`` of
the layer's dense twin after :data:`PROBE_STEPS` training steps, as the TT tensor
``T = W^T`` reshaped to ``(n_1, .., n_d, m_1, .., m_e)`` (zero-padded as the layer pads), and
choose the smallest uniform cap ``r`` whose TT-SVD keeps the relative error

    err(r) = ||T - TTSVD_r(T)||_F / ||T||_F  <=  tol        (tol = :data:`TOLERANCE`)

bounded by the layer's full TT rank (``err = 0`` there) and by ``cap``. ``err(r)`` is not
monotone in ``r`` in general, so the smallest ``r`` is found exactly, not by bisection: with
``t_k(r)`` the energy beyond the ``r`` largest singular values of the ``k``-th unfolding of
``T``,

    max_k t_k(r)  <=  err(r)^2 ||T||^2  <=  sum_k t_k(r)

(Eckart-Young on each unfolding; Oseledets 2011, Theorem 2.2), so every ``r`` below the
first one whose lower bound passes fails, the first one whose upper bound passes passes, and
only the ranks between the two are decomposed. One SVD per bond plus a few TT-SVDs of one
weight: cheap next to training. :func:`brute_force_rank` is the definition itself (every
rank decomposed), the test's oracle.

A layer the rule puts at ``cap`` while the tolerance needs more is ``capped``; the job's
choice says so (``raise max_rank`` by hand if that layer matters).

The job starts every layer at the largest layer's choice (``build_rank``): a rank a layer does
not need costs compute until the early stage's gates cut it, one it lacks costs accuracy, and
starting each layer at its own smaller rank (a fresh draw of its cores) did not help on the
real-data benchmark (docs/method.md#automatic-rank). The start's weights are the twin's,
decomposed (:mod:`engine.train.auto_start`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from engine.models.tensorize import AUTO_RANK_CAP
from engine.nn.meta import on_meta
from engine.tt.decompose import tt_svd, tt_to_full
from engine.tt.shapes import bond_rank_bounds

__all__ = [
    "AUTO_RANK_CAP",
    "PROBE_STEPS",
    "calibrate",
    "choose_layer_ranks",
    "probe_steps",
    "TOLERANCE",
    "RankChoice",
    "AutoRank",
    "brute_force_rank",
    "choose_rank",
    "tt_tensor",
    "tt_svd_error",
]

PROBE_STEPS = 100  # steps of the dense calibration run (at most the first stage's length)
TOLERANCE = 0.2  # relative Frobenius error of the TT-SVD of the calibrated dense weight


@dataclass(frozen=True)
class RankChoice:
    """One layer's choice: ``rank`` (the uniform cap), its TT-SVD error, the layer's full
    rank, and whether ``cap`` cut it short of the tolerance."""

    rank: int
    error: float
    full: int
    capped: bool
    decomposed: int = 0  # TT-SVDs the search ran (the bounds decided the rest)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "error": self.error,
            "full_rank": self.full,
            "capped": self.capped,
        }


def tt_tensor(weight: Tensor, in_modes: Sequence[int], out_modes: Sequence[int]) -> Tensor:
    """The TT tensor ``(n_1..n_d, m_1..m_e)`` of a torch ``(out, in)`` weight, float64,
    zero-padded to the modes' products (as :func:`engine.tt.decompose.matrix_to_tt`)."""
    n_pad, m_pad = math.prod(in_modes), math.prod(out_modes)
    wt = weight.detach().to(torch.float64).T  # (N, M)
    out = wt.new_zeros(n_pad, m_pad)  # (N', M')
    out[: wt.shape[0], : wt.shape[1]] = wt
    return out.reshape(*in_modes, *out_modes)


def tt_svd_error(tensor: Tensor, rank: int) -> float:
    """``||T - TTSVD_rank(T)||_F / ||T||_F`` in float64 (0 for a zero tensor)."""
    t = tensor.to(torch.float64)
    norm = float(torch.linalg.vector_norm(t))
    if norm == 0.0:
        return 0.0
    approx = tt_to_full(tt_svd(t, max_rank=rank))
    return float(torch.linalg.vector_norm(t - approx)) / norm


def _tails(tensor: Tensor) -> list[Tensor]:
    """Per bond ``k``: ``tail[r] = sum_{i >= r} s_i^2`` of the ``k``-th unfolding (float64)."""
    shape = list(tensor.shape)
    out = []
    for k in range(1, len(shape)):
        s = torch.linalg.svdvals(tensor.reshape(math.prod(shape[:k]), -1))  # (q,)
        e = s * s
        tail = torch.flip(torch.cumsum(torch.flip(e, (0,)), 0), (0,))  # tail[i] = sum_{j>=i}
        out.append(torch.cat([tail, tail.new_zeros(1)]))  # (q + 1,)
    return out


def choose_rank(tensor: Tensor, tol: float, cap: int) -> RankChoice:
    """The smallest ``r <= cap`` with ``err(r) <= tol`` (module docstring); ``cap`` itself
    (``capped``) when none is."""
    if not 0 <= tol < 1:
        raise ValueError(f"tol must be in [0, 1), got {tol}")
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    t = tensor.to(torch.float64)
    full = max(bond_rank_bounds(list(t.shape)), default=1)
    norm2 = float(torch.sum(t * t))
    if norm2 == 0.0:
        return RankChoice(1, 0.0, full, False)
    tails = _tails(t)
    budget = tol * tol * norm2

    def tail(k: int, r: int) -> float:
        return float(tails[k][min(r, tails[k].numel() - 1)])

    def lower_ok(r: int) -> bool:
        return all(tail(k, r) <= budget for k in range(len(tails)))

    def upper_ok(r: int) -> bool:
        return sum(tail(k, r) for k in range(len(tails))) <= budget

    lo = next(r for r in range(1, full + 1) if lower_ok(r))
    hi = next(r for r in range(lo, full + 1) if upper_ok(r))
    decomposed = 0
    for r in range(lo, min(hi, cap + 1)):
        decomposed += 1
        err = tt_svd_error(t, r)
        if err <= tol:
            return RankChoice(r, err, full, False, decomposed)
    if hi <= cap:
        return RankChoice(hi, tt_svd_error(t, hi), full, False, decomposed + 1)
    return RankChoice(cap, tt_svd_error(t, cap), full, True, decomposed + 1)


def brute_force_rank(tensor: Tensor, tol: float, cap: int) -> int:
    """The rule by its definition: decompose every rank from 1 up (the test's oracle)."""
    t = tensor.to(torch.float64)
    full = max(bond_rank_bounds(list(t.shape)), default=1)
    for r in range(1, min(full, cap) + 1):
        if tt_svd_error(t, r) <= tol:
            return r
    return min(full, cap)


@dataclass
class AutoRank:
    """The job's choice: per TT layer its :class:`RankChoice`, how the probe ran, and the
    rank the model is built at: the largest layer's, every layer starts there (module doc)."""

    layers: dict[str, RankChoice] = field(default_factory=dict)
    probe: dict[str, Any] = field(default_factory=dict)

    @property
    def build_rank(self) -> int:
        return max((c.rank for c in self.layers.values()), default=1)

    def to_dict(self) -> dict[str, Any]:
        capped = sorted(n for n, c in self.layers.items() if c.capped)
        return {
            "rule": (
                f"smallest TT rank whose TT-SVD of the dense layer after {self.probe.get('steps')} "
                f"calibration steps keeps a relative error <= {self.probe.get('tolerance')}, "
                f"at most {self.probe.get('cap')}; every layer starts at the largest choice"
                + (
                    f", starting from {self.probe['start']['from']}"
                    if "start" in self.probe
                    else ""
                )
            ),
            "probe": dict(self.probe),
            "layers": {n: c.to_dict() for n, c in self.layers.items()},
            "build_rank": self.build_rank,
            "capped": capped,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AutoRank:
        layers = {
            n: RankChoice(int(c["rank"]), float(c["error"]), int(c["full_rank"]), bool(c["capped"]))
            for n, c in data.get("layers", {}).items()
        }
        return cls(layers, dict(data.get("probe", {})))


def choose_layer_ranks(
    weights: Mapping[str, Tensor],
    tt_layers: Iterable[tuple[str, Any]],
    *,
    tol: float = TOLERANCE,
    cap: int = AUTO_RANK_CAP,
) -> dict[str, RankChoice]:
    """Per TT-linear ``(name, TTLinear)`` of the tensorized model, the choice for
    ``weights[name]`` (a torch ``(out, in)`` weight of its dense twin)."""
    out: dict[str, RankChoice] = {}
    for name, layer in tt_layers:
        if name in weights and hasattr(layer, "in_modes"):
            tensor = tt_tensor(weights[name], layer.in_modes, layer.out_modes)
            out[name] = choose_rank(tensor, tol, cap)
    return out


def probe_steps(job: Any) -> int:
    """Steps of the calibration run: :data:`PROBE_STEPS`, at most the first stage's steps."""
    first = job.schedule[0]
    return PROBE_STEPS if first.step_limit is None else min(PROBE_STEPS, first.step_limit)


def calibrate(
    job: Any, workload: Any, data: Any, model_config: Any, device: torch.device
) -> tuple[AutoRank, nn.Module]:
    """Train the dense twin of the job's model for :func:`probe_steps` steps (the first
    stage's learning rates, the job's seed and batches) and choose each TT layer's rank from
    the twin's weight ``W`` then: the rank at which the TT layer can hold what the dense
    layer computes with, random part included (the update ``W - W_0`` alone asked for ranks
    that left digits 1.7 points under dense, docs/method.md#automatic-rank). Returns the
    choice and the trained twin (the start's weights: :mod:`engine.train.auto_start`). The
    global RNG state is as before the call."""
    from engine.nn.dropout import mask_stream
    from engine.train.optim import build_optimizer

    options, stage = job.compression.options, job.schedule[0]
    steps, seed = probe_steps(job), job.training.seed
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        dense = workload.build(model_config, tensorized=False, options=options).to(device)
        with on_meta():
            tt = workload.build(model_config, tensorized=True, options=options)
        from engine.rank import tensorized_layers

        layers = tensorized_layers(tt)
        names = [n for n, _ in layers if isinstance(dense.get_submodule(n), nn.Linear)]
        optimizer = build_optimizer(
            dense, "dense", stage.lr, options=options, weight_decay=job.training.weight_decay
        )
        dense.train()
        done, losses = 0, []
        epoch = 0
        while done < steps:
            seen = False
            for batch in data.train.batches(epoch):
                seen = True
                batch = {k: v.to(device) for k, v in batch.items()}
                with mask_stream(seed, done):
                    loss = workload.forward_loss(dense, batch).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                done += 1
                if done >= steps:
                    break
            if not seen:
                break
            epoch += 1
        dense.zero_grad(set_to_none=True)  # kept for the start: its weights, not its grads
        dense.requires_grad_(False)
        weights = {n: dense.get_submodule(n).weight.detach() for n in names}
        choices = choose_layer_ranks(weights, layers, tol=TOLERANCE, cap=AUTO_RANK_CAP)
    probe = {
        "steps": done,
        "tolerance": TOLERANCE,
        "cap": AUTO_RANK_CAP,
        "linear_d": options.linear_order,  # modes per side of the TT linears (1: two cores)
        "weight": "the dense twin's weight after the calibration steps",
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }
    return AutoRank(choices, probe), dense
