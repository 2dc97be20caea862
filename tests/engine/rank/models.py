"""Small models with TT and TTM layers of several orders, and gate-state generators."""

from __future__ import annotations

import random

import torch
from torch import nn

from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding

DT = torch.float64
VOCAB, CLASSES = 29, 5


class Tiny(nn.Module):
    """TTM embedding (3 cores) -> TT linear (4 cores) -> dense -> TT linear (6 cores)."""

    def __init__(self, dtype: torch.dtype = DT) -> None:
        super().__init__()
        kw = {"dtype": dtype}
        self.emb = TTMEmbedding(
            VOCAB, 12, row_modes=(5, 3, 2), col_modes=(2, 2, 3), ranks=(3, 4), **kw
        )
        self.fc1 = TTLinear(12, 15, in_modes=(4, 3), out_modes=(3, 5), ranks=(3, 4, 2), **kw)
        self.mid = nn.Linear(15, 8, dtype=dtype)
        self.head = TTLinear(
            8, CLASSES, in_modes=(2, 2, 2), out_modes=(1, 1, 5), ranks=(2, 3, 3, 2, 2), **kw
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids).mean(1)  # (B, 12)
        h = torch.tanh(self.fc1(h))  # (B, 15)
        h = torch.tanh(self.mid(h))  # (B, 8)
        return self.head(h)  # (B, CLASSES)


def batch(seed: int, rows: int = 6, length: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, length), generator=g)  # (B, T)
    labels = torch.randint(0, CLASSES, (rows,), generator=g)  # (B,)
    return ids, labels


def gates_of(model: nn.Module) -> list[nn.Parameter]:
    return [g for m in model.modules() if isinstance(m, TTLinear | TTMEmbedding) for g in m.gates]


# live values, values at or below tau = 1e-2 (dead), and a repeated value (ties)
LIVE = (0.03, 0.4, 1.0, 1.0, 1.7)
DEAD = (-0.5, 0.0, 0.005, 0.01)


def randomize_gates_(model: nn.Module, rng: random.Random, p_dead: float) -> None:
    """Every gate entry drawn from LIVE, or from DEAD with probability ``p_dead``."""
    with torch.no_grad():
        for g in gates_of(model):
            vals = [
                rng.choice(DEAD) if rng.random() < p_dead else rng.choice(LIVE)
                for _ in range(g.numel())
            ]
            g.copy_(torch.tensor(vals, dtype=g.dtype))


def kill_random_(model: nn.Module, rng: random.Random, n: int, value: float | None = None) -> None:
    """Set ``n`` randomly chosen gate entries (dead or alive) to ``value`` or a DEAD value."""
    gates = [g for g in gates_of(model) if g.numel()]
    with torch.no_grad():
        for _ in range(n):
            if not gates:
                return
            g = rng.choice(gates)
            g[rng.randrange(g.numel())] = rng.choice(DEAD) if value is None else value
