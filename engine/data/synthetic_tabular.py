"""Synthetic tabular data with known structure: Criteo-format clicks and MLP classification.

Structure comes from ``rng([seed, 0])`` and rows from ``rng([seed, 1])`` (drawn in blocks of
``BLOCK`` rows, so any prefix of the data set is the same whatever ``n``).

**Criteo clicks.** Table ``t`` has ``cardinality[t]`` categories with Zipf(1.1) popularity,
each written as a random 32-bit hex hash. Counts ``I_j = floor(exp(N(mu_j, 1.2))) - 1``
(``I2`` is occasionally negative, as in the real logs); each field is missing (empty) with
probability ``missing_rate``, a missing category has its own effect. The click probability is
logistic over the features the loader produces, ``z_j = log1p(max(I_j, 0))`` (missing: 0)::

    logit = b + sum_t a_t[c_t] + w . z + sum_{s<t<K} <E_s[c_s], E_t[c_t]>

with per-category effects ``a_t ~ N(0, effect_scale^2)``, rank-``rank`` category embeddings
``E_t`` for the first ``K = interaction_tables`` tables (the pairwise dot products a DLRM
interaction layer models), dense weights ``w ~ N(0, dense_scale^2)`` and ``b`` set by bisection
so the mean click probability is ``positive_rate``. ``info`` reports the ``base_rate``
(accuracy of always predicting the majority class) and the Bayes ``oracle_accuracy``
``mean(max(p, 1 - p))`` of the drawn rows.

**MLP arrays.** ``num_classes * clusters_per_class`` Gaussian clusters in ``F = prod(shape)``
dimensions with means ``N(0, I)`` and isotropic noise ``noise``; ``info["oracle_accuracy"]``
is the accuracy of the Bayes classifier (known means, equal weights) on the drawn rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.configs import ConfigError
from engine.data.config import N_CATEGORICAL, check_int, check_real

__all__ = ["CriteoParams", "MLPParams", "criteo_lines", "generate_criteo", "generate_mlp", "BLOCK"]

BLOCK = 8192
N_DENSE = 13
_DEFAULT_CARD = (3, 10, 30, 100, 300, 1000)


def _sizes(name: str, value: object) -> tuple[int, ...]:
    """``value`` (an integer >= 1 or a non-empty tuple of them) as a tuple; else the error
    names ``data.params.<name>``."""
    sizes = (value,) if isinstance(value, int) else value
    if (
        not isinstance(sizes, tuple)
        or not sizes
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes)
    ):
        raise ConfigError(
            f"data.params.{name}", f"must be an integer >= 1 or a list of them, got {value!r}"
        )
    return sizes


@dataclass(frozen=True)
class CriteoParams:
    cardinality: int | tuple[int, ...] = _DEFAULT_CARD  # cycled over the 26 tables
    rank: int = 4
    interaction_tables: int = 8
    effect_scale: float = 0.5
    interaction_scale: float = 0.5
    dense_scale: float = 0.4
    missing_rate: float = 0.05
    positive_rate: float = 0.25

    def __post_init__(self) -> None:
        object.__setattr__(self, "cardinality", _sizes("cardinality", self.cardinality))
        check_int("params.rank", self.rank, 1)
        check_int("params.interaction_tables", self.interaction_tables, 0)
        if self.interaction_tables > N_CATEGORICAL:
            raise ConfigError("data.params.interaction_tables", f"must be <= {N_CATEGORICAL}")
        for name in ("effect_scale", "interaction_scale", "dense_scale"):
            check_real(f"params.{name}", getattr(self, name), 0.0, 100.0)
        check_real("params.missing_rate", self.missing_rate, 0.0, 0.9)
        check_real("params.positive_rate", self.positive_rate, 0.0, 1.0, open_lo=True)
        if self.positive_rate >= 1:
            raise ConfigError("data.params.positive_rate", "must be < 1")

    def table_cardinality(self) -> tuple[int, ...]:
        c = self.cardinality
        return tuple(c[t % len(c)] for t in range(N_CATEGORICAL))  # type: ignore[index]


class _CriteoModel:
    """The hidden structure: popularity, hashes, effects, embeddings, dense weights."""

    def __init__(self, params: CriteoParams, seed: int) -> None:
        rng = np.random.default_rng([seed, 0])
        self.params = params
        self.card = params.table_cardinality()
        self.pop = [np.cumsum(1 / np.arange(1, c + 1) ** 1.1) for c in self.card]
        self.pop = [p / p[-1] for p in self.pop]
        self.hex = [
            np.array([f"{h:08x}" for h in rng.choice(2**32, size=c, replace=False)], dtype=object)
            for c in self.card
        ]
        # effects of each category, index c = card[t] is "missing"
        self.effect = [rng.normal(0, params.effect_scale, c + 1) for c in self.card]
        k, r = params.interaction_tables, params.rank
        scale = params.interaction_scale / math.sqrt(r)
        self.emb = [rng.normal(0, 1, (self.card[t] + 1, r)) * math.sqrt(scale) for t in range(k)]
        self.mu = rng.uniform(0.0, 3.0, N_DENSE)
        self.w = rng.normal(0, params.dense_scale, N_DENSE)
        self.bias = 0.0

    def block(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        """``n`` rows: categories (n, 26) (missing = card), counts (n, 13), missing (n, 13)."""
        miss = self.params.missing_rate
        cats = np.stack(
            [
                np.searchsorted(p, rng.random(n), side="right").clip(max=len(p) - 1)
                for p in self.pop
            ],
            axis=1,
        )  # (n, 26)
        cat_missing = rng.random((n, N_CATEGORICAL)) < miss  # (n, 26)
        cats = np.where(cat_missing, np.array(self.card), cats)  # (n, 26)
        counts = np.floor(np.exp(rng.normal(self.mu, 1.2, (n, N_DENSE)))).astype(np.int64) - 1
        neg = rng.random(n) < 0.02  # (n,)
        counts[:, 1] = np.where(neg, -rng.integers(1, 4, n), counts[:, 1])
        dense_missing = rng.random((n, N_DENSE)) < miss  # (n, 13)
        u = rng.random(n)  # (n,) for the label
        return {"cats": cats, "counts": counts, "dense_missing": dense_missing, "u": u}

    def logits(self, b: dict[str, np.ndarray]) -> np.ndarray:
        z = np.where(b["dense_missing"], 0.0, np.log1p(np.maximum(b["counts"], 0)))  # (n, 13)
        out = self.bias + z @ self.w  # (n,)
        for t in range(N_CATEGORICAL):
            out += self.effect[t][b["cats"][:, t]]
        e = [self.emb[t][b["cats"][:, t]] for t in range(len(self.emb))]  # each (n, r)
        for s in range(len(e)):
            for t in range(s + 1, len(e)):
                out += (e[s] * e[t]).sum(1)
        return out

    def lines(self, b: dict[str, np.ndarray], labels: np.ndarray) -> list[bytes]:
        cols = [np.where(labels, "1", "0").astype(object)]
        for j in range(N_DENSE):
            c = b["counts"][:, j].astype(str).astype(object)
            cols.append(np.where(b["dense_missing"][:, j], "", c))
        for t in range(N_CATEGORICAL):
            table = np.append(self.hex[t], "")
            cols.append(table[b["cats"][:, t]])
        grid = np.stack(cols, axis=1).tolist()  # (n, 40) strings
        return [("\t".join(row) + "\n").encode() for row in grid]


def _rows(model: _CriteoModel, seed: int, n: int) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    rng = np.random.default_rng([seed, 1])
    for start in range(0, n, BLOCK):
        full = model.block(rng, BLOCK)
        k = min(BLOCK, n - start)
        yield {key: v[:k] for key, v in full.items()}, k


def _calibrate(model: _CriteoModel, seed: int) -> None:
    """Bias such that the mean click probability of a reference sample is positive_rate."""
    sample = model.block(np.random.default_rng([seed, 2]), 20_000)
    base = model.logits(sample)
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        p = 1 / (1 + np.exp(-(base + mid)))
        lo, hi = (mid, hi) if p.mean() < model.params.positive_rate else (lo, mid)
    model.bias = (lo + hi) / 2


def criteo_lines(
    n: int, seed: int, params: CriteoParams
) -> tuple[Iterator[list[bytes]], dict[str, Any]]:
    """Blocks of Criteo TSV lines (lazily) and ``info`` filled in once the blocks are drawn."""
    model = _CriteoModel(params, seed)
    _calibrate(model, seed)
    info: dict[str, Any] = {"generator": "criteo", "cardinality": list(model.card)}
    sums = {"n": 0, "pos": 0, "oracle": 0.0}

    def blocks() -> Iterator[list[bytes]]:
        for b, _ in _rows(model, seed, n):
            p = 1 / (1 + np.exp(-model.logits(b)))  # (k,)
            labels = b["u"] < p  # (k,)
            sums["n"] += len(p)
            sums["pos"] += int(labels.sum())
            sums["oracle"] += float(np.maximum(p, 1 - p).sum())
            yield model.lines(b, labels)
        rate = sums["pos"] / max(sums["n"], 1)
        info.update(
            positive_rate=rate,
            base_rate=max(rate, 1 - rate),
            oracle_accuracy=sums["oracle"] / max(sums["n"], 1),
        )

    return blocks(), info


def generate_criteo(n: int, seed: int, params: CriteoParams) -> tuple[list[bytes], dict[str, Any]]:
    """``n`` Criteo TSV lines (bytes, newline-terminated) and the oracle figures."""
    blocks, info = criteo_lines(n, seed, params)
    lines = [line for block in blocks for line in block]
    return lines, info


@dataclass(frozen=True)
class MLPParams:
    shape: int | tuple[int, ...] = 32  # per-row shape of x; F = prod(shape)
    num_classes: int = 4
    clusters_per_class: int = 2
    noise: float = 1.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _sizes("shape", self.shape))
        check_int("params.num_classes", self.num_classes, 2)
        check_int("params.clusters_per_class", self.clusters_per_class, 1)
        check_real("params.noise", self.noise, 0.0, 100.0, open_lo=True)


def generate_mlp(
    n: int, seed: int, params: MLPParams
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """``x`` (n, *shape) float32, ``y`` (n,) int64 and the Bayes accuracy on them."""
    shape = params.shape
    assert isinstance(shape, tuple)
    f = math.prod(shape)
    k = params.num_classes * params.clusters_per_class
    means = np.random.default_rng([seed, 0]).normal(0, 1, (k, f))  # (K, F)
    rng = np.random.default_rng([seed, 1])
    xs, ys = [], []
    for start in range(0, n, BLOCK):
        m = BLOCK
        comp = rng.integers(k, size=m)  # (m,)
        x = means[comp] + rng.normal(0, params.noise, (m, f))  # (m, F)
        xs.append(x[: min(m, n - start)])
        ys.append((comp // params.clusters_per_class)[: min(m, n - start)])
    x = np.concatenate(xs) if xs else np.zeros((0, f))  # (n, F)
    y = np.concatenate(ys) if ys else np.zeros(0, np.int64)  # (n,)
    d2 = (x**2).sum(1)[:, None] - 2 * x @ means.T + (means**2).sum(1)[None, :]  # (n, K)
    logp = -d2 / (2 * params.noise**2)  # (n, K)
    logp = logp.reshape(n, params.num_classes, params.clusters_per_class)  # (n, C, k)
    post = np.logaddexp.reduce(logp, axis=2)  # (n, C)
    oracle = float((post.argmax(1) == y).mean()) if n else 0.0
    info = {
        "generator": "mlp",
        "in_features": f,
        "num_classes": params.num_classes,
        "oracle_accuracy": oracle,
    }
    return x.reshape(n, *shape).astype(np.float32), y.astype(np.int64), info
