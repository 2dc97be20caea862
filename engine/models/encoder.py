"""The post-LN encoder trunk the sentence-pair classifier (:mod:`engine.models.transformer`) and
the masked LM (:mod:`engine.models.mlm`) share, small to large.

Architecture as in the authors' code (docs/method.md#paper-shapes): word + learned position +
token-type embeddings, LayerNorm, dropout; post-LN blocks (residual, then LayerNorm) with a GELU
FFN. ``make_linear`` / ``make_embedding`` build the layers that may be tensorized (dense by
default; :data:`ENCODER_SLOTS` names them by role for :func:`engine.models.tensorize.build_model`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from engine.models.encoder_config import EncoderSizes, TransformerConfig
from engine.models.tensorize import embedding_slot, linear_slot
from engine.nn.attention import scaled_dot_product_attention
from engine.nn.dropout import checkpoint_contexts, dropout, dropout_add
from engine.nn.feed_forward import tt_feed_forward
from engine.nn.premerge import premerged_attention
from engine.nn.tt_linear import TTLinear

__all__ = [
    "ENCODER_SLOTS",
    "EncoderBlock",
    "EncoderModel",
    "MakeEmbedding",
    "MakeLinear",
    "encoder_inputs",
]

MakeLinear = Callable[[str, int, int], nn.Module]  # (role, in, out) -> module
MakeEmbedding = Callable[[int, int], nn.Module]  # (num, dim) -> module

# the layer factories of the encoder models' tensorized builds: every slot named by its role
ENCODER_SLOTS = (
    lambda role, n_in, n_out: linear_slot(n_in, n_out, role=role),
    lambda num, dim: embedding_slot(num, dim, role="embedding"),
)


def encoder_inputs(
    input_ids: Tensor,
    token_type_ids: Tensor | None,
    attention_mask: Tensor | None,
    max_len: int,
    limit: str = "max_len",
) -> tuple[Tensor, Tensor | None]:
    """``(token_type_ids, keep)`` for the encoder blocks, after checking ``input_ids`` is
    ``(B, S)`` with ``S <= max_len`` (``limit``: the config field named in the error);
    ``keep (B, 1, 1, S)`` is True where a token is attended, None without a mask."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (B, S), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] > max_len:
        raise ValueError(f"sequence length {input_ids.shape[1]} > {limit} {max_len}")
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)  # (B, S)
    keep = None
    if attention_mask is not None:
        keep = attention_mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, S) True = attend
    return token_type_ids, keep


class Embeddings(nn.Module):
    def __init__(self, cfg: TransformerConfig, make_embedding: MakeEmbedding) -> None:
        super().__init__()
        self.word = make_embedding(cfg.vocab_size, cfg.d_model)
        self.position = nn.Embedding(cfg.max_len, cfg.d_model)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device)  # (S,)
        x = self.word(input_ids) + self.position(pos) + self.token_type(token_type_ids)  # (B,S,D)
        return dropout(self.norm(x), self.drop.p, self.training)  # (B, S, D)


class SelfAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig, make_linear: MakeLinear) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.attn_dropout = cfg.attn_dropout
        self.keep_probs = not cfg.recompute_attention
        self.q, self.k, self.v = (make_linear("attn", d, d) for _ in range(3))
        self.out = make_linear("attn", d, d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, keep: Tensor | None) -> Tensor:
        return dropout(self.branch(x, keep), self.drop.p, self.training)  # (B, S, D)

    def branch(self, x: Tensor, keep: Tensor | None) -> Tensor:
        """The output before its dropout (the block fuses that dropout with the residual)."""
        b, s, d = x.shape
        h = self.n_heads
        p = self.attn_dropout if self.training else 0.0
        # in a fast-path session with TT projections: all of it in rank space, else None
        y = premerged_attention(x, self.q, self.k, self.v, self.out, h, keep, p, self.keep_probs)
        if y is None:

            def heads(t: Tensor) -> Tensor:
                return t.view(b, s, h, d // h).transpose(1, 2)  # (B, H, S, D/H)

            q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))  # (B, H, S, D/H)
            y = scaled_dot_product_attention(q, k, v, keep, p, self.keep_probs)  # (B,H,S,D/H)
            y = self.out(y.transpose(1, 2).reshape(b, s, d))  # (B, S, D)
        return y


class FeedForward(nn.Module):
    def __init__(self, cfg: TransformerConfig, make_linear: MakeLinear) -> None:
        super().__init__()
        self.fc1 = make_linear("ffn1", cfg.d_model, cfg.d_ff)
        self.fc2 = make_linear("ffn2", cfg.d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(self.branch(x), self.drop.p, self.training)  # (B, S, D)

    def branch(self, x: Tensor) -> Tensor:
        """The output before its dropout (the block fuses that dropout with the residual)."""
        if isinstance(self.fc1, TTLinear) and isinstance(self.fc2, TTLinear):
            return tt_feed_forward(x, self.fc1, self.fc2)  # (B, S, D)  no (B, S, F) kept
        return self.fc2(F.gelu(self.fc1(x)))  # (B, S, D)


class EncoderBlock(nn.Module):
    """Post-LN: ``x = LN(x + attn(x)); x = LN(x + ffn(x))``, each branch's dropout fused with
    its residual add (:func:`engine.nn.dropout.dropout_add`)."""

    def __init__(self, cfg: TransformerConfig, make_linear: MakeLinear) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg, make_linear)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.ffn = FeedForward(cfg, make_linear)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)

    def forward(self, x: Tensor, keep: Tensor | None) -> Tensor:
        train = self.training
        x = self.norm1(dropout_add(x, self.attn.branch(x, keep), self.attn.drop.p, train))
        return self.norm2(dropout_add(x, self.ffn.branch(x), self.ffn.drop.p, train))  # (B,S,D)


class EncoderModel(nn.Module):
    """``config`` and the trunk the classifier and the MLM share: ``embeddings``, then
    ``encoder`` (``n_layers`` :class:`EncoderBlock`), then the subclass's head
    (:meth:`add_head`). ``make_linear`` / ``make_embedding`` build the tensorizable layers
    (dense ``nn.Linear`` / ``nn.Embedding`` by default)."""

    def __init__(
        self,
        config: EncoderSizes,
        make_linear: MakeLinear | None = None,
        make_embedding: MakeEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        enc = config.encoder_config()
        self.recompute = enc.recompute
        make_linear = make_linear or (lambda role, i, o: nn.Linear(i, o))
        make_embedding = make_embedding or nn.Embedding
        self.embeddings = Embeddings(enc, make_embedding)
        self.encoder = nn.ModuleList([EncoderBlock(enc, make_linear) for _ in range(enc.n_layers)])
        self.add_head(enc, make_linear)

    def add_head(self, cfg: TransformerConfig, make_linear: MakeLinear) -> None:
        raise NotImplementedError

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Hidden states ``(B, S, D)`` of the last encoder block."""
        token_type_ids, keep = encoder_inputs(
            input_ids, token_type_ids, attention_mask, self.config.max_len
        )
        grad = self.training and torch.is_grad_enabled()
        x = self.embeddings(input_ids, token_type_ids)  # (B, S, D)
        for block in self.encoder:
            if grad and self.recompute:  # saves x; reruns the block (same masks)
                x = checkpoint(
                    block, x, keep, use_reentrant=False, context_fn=checkpoint_contexts
                )  # (B, S, D)
            else:
                x = block(x, keep)  # (B, S, D)
        return x
