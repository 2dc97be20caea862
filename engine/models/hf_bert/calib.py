"""Sequential calibration: fit every TT linear to the teacher's outputs on the student's inputs.

The whitened TT-SVD of :mod:`engine.models.hf_bert.whiten` fits each layer to the teacher's own
inputs, so the errors of the layers below add up unseen. Here the encoder is fitted block by
block, and inside a block stage by stage (:data:`STAGES`), in the order the data flows::

    x --(q, k, v)--> attention context --(out)--> h = LN1(x + out) --(fc1)--> gelu --(fc2)--> LN2

At each stage the student's input rows ``X`` (attended tokens, computed through the already
fitted student layers) and the teacher's output rows ``Y`` of the same layer (on the teacher's
own stream) give the affine least-squares fit ``A x + b ~ y`` of rank ``r``
(:func:`solve`): with the centred ``C = cov(X) = S^T S`` (Cholesky, ``S`` upper),
``M = S^{-T} cov(X, Y)``, ``A^T = S^{-1} [M]_r`` (``[.]_r``: truncated SVD) and
``b = mean(Y) - A mean(X)``: the closed-form minimizer of ``||X A^T + b - Y||_F`` over
rank-``r`` ``A``. Each layer so absorbs the drift of the layers below it, and the bias the
mean of the error. With the teacher's own inputs (``X = X_t``, ``Y = X_t W^T + b``) it is the
centred whitened truncation, which :mod:`engine.models.hf_bert.ranks` profiles.

Two options of :func:`fit_sequential_` (:mod:`engine.models.hf_bert.prepare` sets
``residual``):

* ``residual``: ``attention.output.dense`` and ``output.dense`` add their output to a
  residual stream before a LayerNorm (``LN(r + y)``). Their target becomes
  ``y_t + (r_t - r_s)``, so the layer also cancels the part of the residual stream's drift
  that its input can explain: the student's pre-LN sum then fits the teacher's ``r_t + y_t``.
* ``anchor = a``: the teacher's own rows ``(X_t, X_t W^T + b)`` are added with weight ``a``
  (a weighted least squares). The original layer fits them exactly, so they pull the fit
  towards it where the calibration rows alone would overfit (a prior; it pays with few
  calibration sentences only, see :data:`ANCHOR_SEQUENTIAL`).

The layer is rebuilt at its modes: for two cores (``d = 1``) the cores are the two factors of
``A^T`` directly; otherwise by TT-SVD of ``A`` with every bond capped at ``r``. Cores are then
balanced. Sums are float64 (each batch's ``X^T X`` is a float32 product of rows shifted by the
first batch's mean, so centring loses no digits); ridge ``1e-6 * mean(diag C)`` as the
whitened init. Memory: one stage tensor per calibration batch, for student and teacher.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from engine.models.hf_bert.batches import Batch
from engine.models.hf_bert.whiten import balance_cores_, replace_module_
from engine.nn.attention import scaled_dot_product_attention
from engine.nn.params import ParamList
from engine.nn.tt_linear import TTLinear

__all__ = [
    "STAGES",
    "RIDGE",
    "RIDGE_SEQUENTIAL",
    "ANCHOR_SEQUENTIAL",
    "AffineStats",
    "Whitened",
    "solve",
    "tt_from_factors",
    "block_stages",
    "run_block",
    "embed",
    "encoder_layers",
    "teacher_stage_stats",
    "fit_sequential_",
]

RIDGE = 1e-6
MAX_RIDGE_STEPS = 6  # RIDGE .. 1e-1 of the mean variance
RIDGE_SEQUENTIAL = 1e-2  # what prepare uses: measured best on MiniLM (bench/minilm_fidelity.py)
# what prepare uses: no anchor. On MiniLM (held-out cosine at 5x) a = 0.25 helps with 1024
# calibration sentences (0.826 -> 0.831) but hurts with 4000 (0.855 -> 0.848)
ANCHOR_SEQUENTIAL = 0.0
# the linears of a BertLayer, grouped by the tensor they read, in data-flow order
STAGES = (
    ("attention.self.query", "attention.self.key", "attention.self.value"),
    ("attention.output.dense",),
    ("intermediate.dense",),
    ("output.dense",),
)
LAYERS = "encoder.layer"  # the layers' parent, below the model root


class Whitened(NamedTuple):
    s: Tensor  # (in, in) upper: cov(X) + ridge = S^T S
    m: Tensor  # (in, out) S^{-T} cov(X, Y)
    mean_x: Tensor  # (in,)
    mean_y: Tensor  # (out,)


@dataclass
class AffineStats:
    """Running float64 sums of ``x (N, in)`` and ``y (N, out)`` rows for an affine fit; each
    :meth:`add` may weight its rows (weighted least squares)."""

    count: float = 0.0  # rows seen, weighted
    shift: Tensor | None = None  # (in,) first batch's mean of x: keeps the sums centred
    sum_x: Tensor | None = None  # (in,)
    sum_y: Tensor | None = None  # (out,)
    xx: Tensor | None = None  # (in, in)
    xy: Tensor | None = None  # (in, out)

    def add(self, x: Tensor, y: Tensor, weight: float = 1.0) -> None:
        if x.shape[0] == 0 or weight == 0:
            return
        if self.shift is None:
            self.shift = x.mean(0)  # (in,)
            f64 = {"dtype": torch.float64, "device": x.device}
            self.sum_x = torch.zeros(x.shape[1], **f64)
            self.sum_y = torch.zeros(y.shape[1], **f64)
            self.xx = torch.zeros(x.shape[1], x.shape[1], **f64)
            self.xy = torch.zeros(x.shape[1], y.shape[1], **f64)
        assert self.sum_x is not None and self.sum_y is not None
        assert self.xx is not None and self.xy is not None
        xc = x - self.shift  # (N, in)
        self.count += weight * x.shape[0]
        self.sum_x += weight * xc.sum(0, dtype=torch.float64)
        self.sum_y += weight * y.sum(0, dtype=torch.float64)
        self.xx.add_(xc.T @ xc, alpha=weight)  # (in, in) promoted in place: no scaled copy
        self.xy.add_(xc.T @ y, alpha=weight)  # (in, out)

    def whitened(self, ridge: float = RIDGE) -> Whitened:
        if self.count == 0 or self.xx is None:
            raise ValueError("no calibration rows were seen")
        assert self.sum_x is not None and self.sum_y is not None and self.shift is not None
        assert self.xy is not None
        n = float(self.count)
        mx, my = self.sum_x / n, self.sum_y / n  # (in,), (out,) mx in shifted coordinates
        cov = self.xx / n - torch.outer(mx, mx)  # (in, in)
        cxy = self.xy / n - torch.outer(mx, my)  # (in, out)
        eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
        scale = cov.diagonal().mean().clamp_min(1e-30) * eye  # (in, in)
        # fewer calibration rows than inputs leave cov singular, and its rounding may leave
        # it indefinite beyond the ridge: a ridge 10x larger until it factors
        for _ in range(MAX_RIDGE_STEPS):
            lower, info = torch.linalg.cholesky_ex(cov + ridge * scale)  # (in, in)
            if int(info) == 0:
                break
            ridge *= 10
        else:
            raise ValueError(f"the calibration covariance does not factor at ridge {ridge:g}")
        s = lower.mT  # (in, in) upper
        m = torch.linalg.solve_triangular(s.mT, cxy, upper=False)  # (in, out)
        return Whitened(s, m, mx + self.shift.double(), my)


def solve(
    w: Whitened, rank: int, cols: slice = slice(None)
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(left (in, r), right (r, out), b (out,), sv)``: ``A^T = left @ right`` is the
    rank-``r`` fit of the output columns ``cols`` (module docstring); ``sv`` the singular
    values of ``M`` (descending), from the eigenvalues of its smaller Gram matrix."""
    m = w.m[:, cols]  # (in, out)
    r = max(1, min(int(rank), *m.shape))
    if m.shape[0] >= m.shape[1]:  # [M]_r = (M V_r) V_r^T
        vals, vecs = torch.linalg.eigh(m.T @ m)  # ascending, (out,), (out, out)
        v = vecs[:, -r:].flip(1)  # (out, r)
        left, right = torch.linalg.solve_triangular(w.s, m @ v, upper=True), v.T
    else:  # [M]_r = U_r (U_r^T M)
        vals, vecs = torch.linalg.eigh(m @ m.T)  # (in,), (in, in)
        u = vecs[:, -r:].flip(1)  # (in, r)
        left, right = torch.linalg.solve_triangular(w.s, u, upper=True), u.T @ m
    bias = w.mean_y[cols] - (w.mean_x @ left) @ right  # (out,)
    return left, right, bias, vals.flip(0).clamp_min(0).sqrt()


def tt_from_factors(old: TTLinear, left: Tensor, right: Tensor, bias: Tensor) -> TTLinear:
    """A ``TTLinear`` with ``old``'s modes, threshold and plan for ``W^T = left @ right``
    (``left (in, r)``, ``right (r, out)``), bias ``bias``, cores balanced."""
    dtype, r = old.cores[0].dtype, left.shape[1]
    unpadded = math.prod(old.in_modes) == old.in_features and (
        math.prod(old.out_modes) == old.out_features
    )
    if len(old.in_modes) == 1 and unpadded:  # two cores: the factors themselves
        new = TTLinear(
            old.in_features,
            old.out_features,
            True,
            in_modes=old.in_modes,
            out_modes=old.out_modes,
            max_rank=r,
            gate_threshold=old.gate_threshold,
            plan=old.plan,
            device="meta",
            dtype=dtype,
        )
        cores = [left.reshape(1, old.in_features, r), right.reshape(r, old.out_features, 1)]
        new.cores = ParamList([nn.Parameter(c.to(dtype).contiguous()) for c in cores])
        new.gates = ParamList([nn.Parameter(torch.ones(r, dtype=dtype, device=bias.device))])
        new.bias = nn.Parameter(bias.detach().to(dtype).clone())
    else:
        probe = nn.Linear(old.in_features, old.out_features, device="meta")
        probe.weight = nn.Parameter((left @ right).T.to(dtype))
        probe.bias = nn.Parameter(bias.detach().to(dtype))
        new = TTLinear.from_linear(
            probe,
            max_rank=r,
            in_modes=old.in_modes,
            out_modes=old.out_modes,
            gate_threshold=old.gate_threshold,
            plan=old.plan,
        )
    balance_cores_(new)
    return new


def _heads(attn: nn.Module, t: Tensor) -> Tensor:
    b, s, d = t.shape
    h = attn.num_attention_heads
    return t.view(b, s, h, d // h).transpose(1, 2)  # (B, H, S, D/H)


def block_stages(
    block: nn.Module, x: Tensor, keep: Tensor, *, teacher: bool
) -> Generator[tuple[Tensor, Tensor | None], None, Tensor]:
    """Yield ``(input, outputs)`` of each of :data:`STAGES` of the ``BertLayer`` ``block``
    (eval mode, no grad; ``x (B, S, D)``, ``keep (B, 1, 1, S)`` True where attended), return
    the layer's output ``(B, S, D)``.

    ``teacher=True``: ``outputs`` are the stage's linears' outputs (concatenated, ``(B, S,
    out)``), computed before the yield and reused. ``teacher=False``: ``outputs`` is ``None``
    and the modules are looked up after each resume, so a layer replaced between two ``next``
    calls is the one the later stages run through.
    """
    attn = block.attention.self

    def qkv_of() -> tuple[Tensor, Tensor, Tensor]:
        return attn.query(x), attn.key(x), attn.value(x)  # (B, S, D) each

    qkv = qkv_of() if teacher else None
    yield x, None if qkv is None else torch.cat(qkv, -1)
    q, k, v = qkv if qkv is not None else qkv_of()
    b, s, d = x.shape
    y = scaled_dot_product_attention(_heads(attn, q), _heads(attn, k), _heads(attn, v), keep, 0.0)
    ctx = y.transpose(1, 2).reshape(b, s, d)  # (B, S, D)
    del q, k, v, qkv, y
    att_out = block.attention.output
    out = att_out.dense(ctx) if teacher else None  # (B, S, D)
    yield ctx, out
    h = att_out.LayerNorm(x + (out if out is not None else att_out.dense(ctx)))  # (B, S, D)
    del ctx, out
    mid = block.intermediate
    f = mid.dense(h) if teacher else None  # (B, S, F)
    yield h, f
    g = mid.intermediate_act_fn(f if f is not None else mid.dense(h))  # (B, S, F)
    del f
    y2 = block.output.dense(g) if teacher else None  # (B, S, D)
    yield g, y2
    return block.output.LayerNorm(h + (y2 if y2 is not None else block.output.dense(g)))


def _finish(gen: Generator[tuple[Tensor, Tensor | None], None, Tensor]) -> Tensor:
    try:
        next(gen)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("block_stages yielded more stages than STAGES")


def run_block(block: nn.Module, x: Tensor, keep: Tensor) -> Tensor:
    """The ``BertLayer`` ``block`` on ``x (B, S, D)`` by :func:`block_stages`: ``(B, S, D)``."""
    gen = block_stages(block, x, keep, teacher=False)
    for _ in STAGES:
        next(gen)
    return _finish(gen)


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ``BertLayer`` list of ``model`` (a BERT encoder or transformers' ``BertModel``)."""
    return model.get_submodule(LAYERS)


def embed(model: nn.Module, batches: Sequence[Batch]) -> list[Tensor]:
    """The embedding layer's output ``(B, S, D)`` of every batch."""
    return [model.embeddings(input_ids=ids, token_type_ids=t) for ids, _, t in batches]


def _columns(block: nn.Module, stage: Sequence[str]) -> dict[str, slice]:
    """Where each linear's outputs sit in the stage's concatenated outputs."""
    out, start = {}, 0
    for n in stage:
        width = block.get_submodule(n).out_features
        out[n], start = slice(start, start + width), start + width
    return out


@torch.no_grad()
def teacher_stage_stats(teacher: nn.Module, batches: Sequence[Batch]) -> dict[str, Whitened]:
    """Per linear ``encoder.layer.<i>.<name>``: the whitened sums of the teacher's own input and
    output rows (attended tokens), keyed by layer; the stage's linears share ``S``."""
    teacher.eval()
    xt = embed(teacher, batches)
    masks = [m.bool() for _, m, _ in batches]
    keeps = [m[:, None, None, :] for m in masks]  # (B, 1, 1, S)
    out: dict[str, Whitened] = {}
    for i, block in enumerate(encoder_layers(teacher)):
        gens = [block_stages(block, x, k, teacher=True) for x, k in zip(xt, keeps, strict=True)]
        for stage in STAGES:
            stats = AffineStats()
            for gen, m in zip(gens, masks, strict=True):
                x, y = next(gen)
                assert y is not None
                stats.add(x[m], y[m])  # (N, in), (N, out)
            w = stats.whitened()
            for n, cols in _columns(block, stage).items():
                out[f"{LAYERS}.{i}.{n}"] = Whitened(w.s, w.m[:, cols], w.mean_x, w.mean_y[cols])
        xt = [_finish(g) for g in gens]
    return out


@torch.no_grad()
def fit_sequential_(
    student: nn.Module,
    teacher: nn.Module,
    batches: Sequence[Batch],
    ranks: Mapping[str, int],
    *,
    ridge: float = RIDGE,
    residual: bool = False,
    anchor: float = 0.0,
) -> list[dict]:
    """Refit every ``TTLinear`` of ``student`` named in ``ranks`` (``encoder.layer.<i>.<n>``)
    at that rank, block by block (module docstring; ``residual`` and ``anchor`` there); both
    models in eval mode. Returns per
    layer ``name``, ``rank`` and ``fit_error`` ``||M - [M]_r|| / ||M||``: the relative error
    on what the student's inputs can explain of the teacher's outputs (calibration rows)."""
    student.eval()
    teacher.eval()
    xs, xt = embed(student, batches), embed(teacher, batches)
    masks = [m.bool() for _, m, _ in batches]
    keeps = [m[:, None, None, :] for m in masks]  # (B, 1, 1, S)
    rows: list[dict] = []
    pairs = zip(encoder_layers(student), encoder_layers(teacher), strict=True)
    for i, (s_block, t_block) in enumerate(pairs):
        s_gens = [
            block_stages(s_block, x, k, teacher=False) for x, k in zip(xs, keeps, strict=True)
        ]
        t_gens = [block_stages(t_block, x, k, teacher=True) for x, k in zip(xt, keeps, strict=True)]
        res_s, res_t = list(xs), list(xt)  # the residual stream each stage's output joins
        for k, stage in enumerate(STAGES):
            stats = AffineStats()
            for j, (s_gen, t_gen, m) in enumerate(zip(s_gens, t_gens, masks, strict=True)):
                x_s, _ = next(s_gen)
                x_t, y_t = next(t_gen)
                assert y_t is not None
                stats.add(x_t[m], y_t[m], anchor)  # the teacher's own rows (exact for W)
                if k == 2:  # intermediate reads h = LN1(x + out): the residual output joins
                    res_s[j], res_t[j] = x_s, x_t
                if residual and k in (1, 3):  # the two output denses: absorb the residual drift
                    y_t = y_t + (res_t[j] - res_s[j])  # (B, S, out)
                stats.add(x_s[m], y_t[m])  # (N, in), (N, out) attended tokens
            w = stats.whitened(ridge)
            for n, cols in _columns(t_block, stage).items():
                full = f"{LAYERS}.{i}.{n}"
                old = s_block.get_submodule(n)
                if full not in ranks:
                    continue
                if not isinstance(old, TTLinear) or old.bias is None:
                    raise ValueError(f"{full} is not a TT linear with a bias")
                left, right, bias, sv = solve(w, ranks[full], cols)
                replace_module_(s_block, n, tt_from_factors(old, left, right, bias))
                rows.append(
                    {
                        "name": full,
                        "rank": int(left.shape[1]),
                        "fit_error": _tail(sv, left.shape[1]),
                    }
                )
        xs = [_finish(g) for g in s_gens]
        xt = [_finish(g) for g in t_gens]
    return rows


def _tail(sv: Tensor, rank: int) -> float:
    """``sqrt(sum_{i >= rank} sv_i^2 / sum sv_i^2)``: the relative truncation error."""
    energy = sv.double() ** 2  # (q,)
    return float((energy[rank:].sum() / energy.sum().clamp_min(1e-300)).sqrt())
