"""BERT-style encoder with a masked-language-model head, for pre-training; dense or tensorized.

The encoder is the transformer's (``Embeddings`` and post-LN ``EncoderBlock`` from
:mod:`engine.models.encoder`, imported, not copied). The head follows BERT::

    h      = encoder(input_ids)                    # (B, S, D)
    logits = decoder(LN(gelu(transform(h))))       # (B, S, V)

``transform`` is ``D -> D`` and ``decoder`` ``D -> V`` with a bias. The decoder is not tied to
the word embedding: a TT decoder cannot share its weight with a TTM table. When only the
masked positions are needed (the loss), ``forward(..., select=mask)`` runs the head on the
selected rows only, saving the ``D x V`` product on every other position.

Tensorizable layers (see :mod:`engine.models.tensorize`): ``embeddings.word`` (TTM), every
encoder linear ``encoder.<i>.attn.{q,k,v,out}`` / ``encoder.<i>.ffn.{fc1,fc2}`` and the head's
``head.transform`` / ``head.decoder`` (TT). Position / token-type embeddings and LayerNorms
stay dense. The defaults are BERT-base (12 layers, d = 768, vocabulary 30522).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.configs import spec, validate
from engine.models.encoder import ENCODER_SLOTS, EncoderModel, MakeLinear
from engine.models.encoder_config import EncoderSizes, TransformerConfig
from engine.models.limits import (
    MAX_LAYERS,
)
from engine.models.tensorize import (
    TensorizeOptions,
    build_model,
)

__all__ = ["MLMConfig", "MLMHead", "MaskedLM", "build_mlm", "masked_lm_loss", "IGNORE_INDEX"]

CONFIG_VERSION = 1
IGNORE_INDEX = -100  # label of the positions that carry no loss


@dataclass(frozen=True)
class MLMConfig(EncoderSizes):
    """Sizes of the encoder and head; the defaults are BERT-base."""

    n_layers: int = spec(12, ge=1, le=MAX_LAYERS)
    dropout: float = spec(0.1, ge=0, lt=1)
    attn_dropout: float = spec(0.1, ge=0, lt=1)
    ln_eps: float = spec(1e-12, gt=0, le=1)
    version: int = spec(CONFIG_VERSION, choices=(CONFIG_VERSION,))

    def __post_init__(self) -> None:
        validate(self)
        self.encoder_config()  # the encoder's checks name the same fields

    def encoder_config(self) -> TransformerConfig:
        """The transformer config the shared encoder classes read (``num_classes`` unused)."""
        kw = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "version"}
        return TransformerConfig(**kw)

    @classmethod
    def tiny(cls, **changes: Any) -> Self:
        """A small model for tests and smoke runs."""
        return super().tiny(**{"vocab_size": 120, **changes})


class MLMHead(nn.Module):
    """``decoder(LN(gelu(transform(h))))``: hidden states (..., D) -> vocabulary logits."""

    def __init__(self, cfg: TransformerConfig, make_linear: MakeLinear) -> None:
        super().__init__()
        self.transform = make_linear("mlm_transform", cfg.d_model, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.decoder = make_linear("mlm_decoder", cfg.d_model, cfg.vocab_size)

    def forward(self, h: Tensor) -> Tensor:
        h = self.norm(F.gelu(self.transform(h)))  # (..., D)
        return self.decoder(h)  # (..., V)


class MaskedLM(EncoderModel):
    """``(input_ids (B,S), attention_mask, token_type_ids) -> logits (B,S,V)`` or ``(N,V)``."""

    config: MLMConfig

    def add_head(self, cfg: TransformerConfig, make_linear: MakeLinear) -> None:
        self.head = MLMHead(cfg, make_linear)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        select: Tensor | None = None,
    ) -> Tensor:
        """Logits ``(B, S, V)``; with a bool ``select (B, S)`` only its ``N`` rows, ``(N, V)``."""
        h = self.encode(input_ids, attention_mask, token_type_ids)  # (B, S, D)
        if select is not None:
            h = h[select]  # (N, D), row-major order of the True entries
        return self.head(h)  # (B, S, V) or (N, V)


def build_mlm(
    config: MLMConfig,
    *,
    tensorized: bool,
    options: TensorizeOptions | None = None,
) -> MaskedLM:
    """Dense model, or the CoMERA model with TT linears and a TTM word embedding (random init).

    ``options`` (default :class:`~engine.models.tensorize.TensorizeOptions`; automatic shapes
    only, ``options.shapes`` is not read); the layers left dense are listed, with the reason,
    in ``model.tensorize_report``.
    """
    return build_model(
        MaskedLM, config, tensorized=tensorized, options=options, slots=ENCODER_SLOTS
    )


def masked_lm_loss(logits: Tensor, targets: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean CE over ``N`` selected rows (0 when ``N = 0``) and the sums count/loss_sum/correct."""
    n = targets.numel()
    total = F.cross_entropy(logits, targets, reduction="sum")  # ()
    loss = total / max(n, 1)  # ()
    with torch.no_grad():
        count = torch.tensor(float(n), device=logits.device)
        correct = (logits.argmax(-1) == targets).sum().to(logits.dtype)  # ()
    return loss, {"count": count, "loss_sum": total.detach(), "correct": correct}
