"""DLRM for click-through prediction (Naumov et al. 2019), dense or tensorized.

Forward, as in facebookresearch/dlrm (``dlrm_s_pytorch.py``, ``interact_features``, "dot")::

    x   = bottom(dense)                        # (B, D)  ReLU after every layer, the last too
    e_j = table_j(sparse[:, j])                # (B, D)  one table per categorical feature
    T   = [x, e_1, ..., e_n]                   # (B, F, D), F = 1 + n
    Z   = T T^T                                # (B, F, F)
    r   = [x, Z[:, i, j] for i > j]            # (B, D + F(F-1)/2), Facebook's pair order
    logit = top(r)                             # (B,)    ReLU between layers, none at the end

Z is symmetric, so the strict lower triangle (row-major, Facebook's order) holds the same
pairs as the upper one. The default sizes are the Criteo Kaggle (Display Advertising
Challenge) model of the DLRM repository: table cardinalities below, D = 16, bottom MLP
13-512-256-64-16, top MLP 367-512-256-1.

Tensorizable layers (see :mod:`engine.models.tensorize`): every table ``embeddings.<j>``
(``TTMEmbedding``, rows and columns factorized automatically) and every MLP linear
``bottom.<i>`` / ``top.<i>`` (``TTLinear``). With the default ``layers=("*",)`` all of them
are tensorized unless their dense weight has fewer than ``min_size`` entries (small tables,
the 256 -> 1 output); ``layers=("embeddings.*",)`` compresses the tables only.

Initialization follows the DLRM code for the tables: ``U(-1/sqrt(n), 1/sqrt(n))`` for a
table with ``n`` rows; a TTM table is drawn as usual and its cores rescaled so its entries
have the same variance ``1/(3n)``. The linears keep PyTorch's / ``TTLinear``'s init.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from engine.configs import ConfigMethods, spec, validate
from engine.models.limits import (
    MAX_EMBEDDING_DIM,
    MAX_HIDDEN_LAYERS,
    MAX_TABLE_ROWS,
    MAX_TABLES,
    MAX_WIDTH,
)
from engine.models.mlp import MLPStack
from engine.models.tensorize import (
    TensorizeOptions,
    build_model,
    embedding_slot,
    linear_slot,
)
from engine.nn.ttm_embedding import TTMEmbedding

__all__ = ["DLRMConfig", "DLRM", "build_dlrm", "dot_interaction", "KAGGLE_TABLE_SIZES"]

CONFIG_VERSION = 1

# rows per categorical feature C1..C26 of Criteo Kaggle, as counted by facebookresearch/dlrm
KAGGLE_TABLE_SIZES: tuple[int, ...] = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)

MakeLinear = Callable[[int, int], nn.Module]  # (in, out) -> module
MakeEmbedding = Callable[[int, int], nn.Module]  # (rows, dim) -> module


@dataclass(frozen=True)
class DLRMConfig(ConfigMethods):
    """Sizes of the model; the defaults are the Criteo Kaggle DLRM."""

    REQUIRED = ("version",)

    n_dense: int = spec(13, ge=1, le=MAX_WIDTH)
    table_sizes: tuple[int, ...] = spec(
        KAGGLE_TABLE_SIZES, ge=1, le=MAX_TABLE_ROWS, length=(1, MAX_TABLES)
    )
    embedding_dim: int = spec(16, ge=1, le=MAX_EMBEDDING_DIM)
    # hidden widths; the last layer gives D
    bottom_widths: tuple[int, ...] = spec(
        (512, 256, 64), ge=1, le=MAX_WIDTH, length=(0, MAX_HIDDEN_LAYERS)
    )
    # hidden widths; the last layer gives 1 logit
    top_widths: tuple[int, ...] = spec(
        (512, 256), ge=1, le=MAX_WIDTH, length=(0, MAX_HIDDEN_LAYERS)
    )
    version: int = spec(CONFIG_VERSION, choices=(CONFIG_VERSION,))

    def __post_init__(self) -> None:
        validate(self)

    @property
    def n_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def interaction_dim(self) -> int:
        """Width of the top MLP input: ``D + F (F - 1) / 2`` with ``F = 1 + n_tables``."""
        f = 1 + self.n_tables
        return self.embedding_dim + f * (f - 1) // 2

    @classmethod
    def kaggle(cls, **changes: Any) -> DLRMConfig:
        """The Criteo Kaggle model of the DLRM repository."""
        return cls(**changes)

    @classmethod
    def tiny(cls, **changes: Any) -> DLRMConfig:
        """A small model for tests and smoke runs (some tables large enough for TTM)."""
        base = {
            "table_sizes": (300, 7, 200, 50),
            "embedding_dim": 8,
            "bottom_widths": (96,),
            "top_widths": (64,),
        }
        return cls(**{**base, **changes})


def dot_interaction(bottom: Tensor, embedded: Sequence[Tensor]) -> Tensor:
    """``[x, <v_i, v_j> for i > j]`` over ``v = [x, e_1, ..., e_n]`` (Facebook's pair order)."""
    t = torch.stack([bottom, *embedded], dim=1)  # (B, F, D)
    z = torch.bmm(t, t.transpose(1, 2))  # (B, F, F)
    f = t.shape[1]
    li, lj = torch.tril_indices(f, f, offset=-1, device=t.device)  # (P,) each, P = F(F-1)/2
    return torch.cat([bottom, z[:, li, lj]], dim=1)  # (B, D + P)


class DLRM(nn.Module):
    """``(dense (B, n_dense) float, sparse (B, n_tables) long) -> logits (B,)``."""

    def __init__(
        self,
        config: DLRMConfig,
        make_linear: MakeLinear | None = None,
        make_embedding: MakeEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        d = config.embedding_dim
        make_embedding = make_embedding or nn.Embedding
        self.bottom = MLPStack(
            (config.n_dense, *config.bottom_widths, d),
            make_linear,
            activation="relu",
            last_activation=True,
        )
        self.embeddings = nn.ModuleList([make_embedding(n, d) for n in config.table_sizes])
        self.top = MLPStack(
            (config.interaction_dim, *config.top_widths, 1),
            make_linear,
            activation="relu",
            last_activation=False,
        )
        self.reset_embeddings()

    def reset_embeddings(self) -> None:
        """DLRM's table init: entries of variance ``1/(3n)`` (``U(+-1/sqrt(n))`` if dense)."""
        with torch.no_grad():
            for n, table in zip(self.config.table_sizes, self.embeddings, strict=True):
                if isinstance(table, nn.Embedding):
                    table.weight.uniform_(-1 / math.sqrt(n), 1 / math.sqrt(n))
                elif isinstance(table, TTMEmbedding):  # table variance 1 -> 1/(3n)
                    table.reset_parameters()
                    scale = (1.0 / math.sqrt(3 * n)) ** (1.0 / len(table.cores))
                    for core in table.cores:
                        core.mul_(scale)

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        cfg = self.config
        if dense.ndim != 2 or dense.shape[1] != cfg.n_dense:
            raise ValueError(f"dense must be (B, {cfg.n_dense}), got {tuple(dense.shape)}")
        if sparse.shape != (dense.shape[0], cfg.n_tables):
            raise ValueError(
                f"sparse must be (B, {cfg.n_tables}) with B = {dense.shape[0]}, "
                f"got {tuple(sparse.shape)}"
            )
        x = self.bottom(dense)  # (B, D)
        embedded = [table(sparse[:, j]) for j, table in enumerate(self.embeddings)]  # (B, D)
        r = dot_interaction(x, embedded)  # (B, D + F(F-1)/2)
        return self.top(r).squeeze(1)  # (B,)


def build_dlrm(
    config: DLRMConfig,
    *,
    tensorized: bool,
    options: TensorizeOptions | None = None,
) -> DLRM:
    """Dense model, or tables as ``TTMEmbedding`` and MLP linears as ``TTLinear`` (random init).

    ``options`` (default :class:`~engine.models.tensorize.TensorizeOptions`): tables use
    ``embedding_max_rank`` (default ``max_rank``), linears ``max_rank``; ``d`` is the number of
    TTM cores / modes per TT side (per-size default when ``None``). The layers left dense are
    listed, with the reason, in ``model.tensorize_report``.
    """
    slots = (lambda n_in, n_out: linear_slot(n_in, n_out), embedding_slot)
    model = build_model(DLRM, config, tensorized=tensorized, options=options, slots=slots)
    if tensorized:
        model.reset_embeddings()  # the tables are real only now
    return model
