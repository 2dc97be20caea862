"""The paper's sentence-pair classifier: six post-LN encoder blocks, dense or tensorized.

Architecture as in the authors' code (docs/method.md#paper-shapes): word + learned position +
token-type embeddings, LayerNorm, dropout; post-LN blocks (residual, then LayerNorm, eps 1e-9) with
GELU FFN; the classifier reads the first token: fc1 (d -> d) -> tanh -> dropout -> fc2 (d -> C).

``build_transformer(config, tensorized=True)`` builds the CoMERA model directly with random init
(training from scratch): every encoder linear and the classifier fc1 are ``TTLinear``, the word
embedding is ``TTMEmbedding``; classifier fc2, position / token-type embeddings and LayerNorms stay
dense. ``options.shapes="paper"`` (the default here) uses the exact shapes of
docs/method.md#paper-shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from engine.configs import ConfigError, ConfigMethods, spec, validate
from engine.contract.lowrank_saved import recompute_tt_outputs
from engine.models.limits import (
    MAX_CLASSES,
    MAX_FF,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_LEN,
    MAX_TYPE_VOCAB,
    MAX_VOCAB,
    MAX_WIDTH,
)
from engine.models.tensorize import (
    Slot,
    Specialize,
    TensorizeOptions,
    build_model,
    embedding_slot,
    linear_slot,
)
from engine.nn.attention import scaled_dot_product_attention
from engine.nn.dropout import checkpoint_contexts, dropout, dropout_add
from engine.nn.feed_forward import tt_feed_forward
from engine.nn.premerge import premerged_attention
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding

__all__ = [
    "TransformerConfig",
    "TransformerClassifier",
    "build_transformer",
    "ParameterReport",
    "parameter_report",
    "MNLI_SHAPES",
]

CONFIG_VERSION = 1

# docs/method.md#paper-shapes: (in_modes, out_modes) per role; embedding rows, cols and fixed ranks
MNLI_SHAPES: dict[str, Any] = {
    "attn": ((12, 8, 8), (8, 8, 12)),
    "ffn1": ((12, 8, 8), (12, 16, 16)),
    "ffn2": ((16, 16, 12), (8, 8, 12)),
    "cls1": ((12, 8, 8), (8, 8, 12)),
    "embedding": ((16, 20, 10, 10), (4, 4, 8, 6), (1, 32, 32, 32, 1)),
}

MakeLinear = Callable[[str, int, int], nn.Module]  # (role, in, out) -> module
MakeEmbedding = Callable[[int, int], nn.Module]  # (num, dim) -> module


@dataclass(frozen=True)
class EncoderSizes(ConfigMethods):
    """The encoder's leading fields, shared by :class:`TransformerConfig` and
    :class:`engine.models.mlm.MLMConfig` (each adds its own after them)."""

    REQUIRED = ("version",)

    vocab_size: int = spec(30522, ge=1, le=MAX_VOCAB)
    d_model: int = spec(768, ge=1, le=MAX_WIDTH)
    n_heads: int = spec(12, ge=1, le=MAX_HEADS)
    d_ff: int = spec(3072, ge=1, le=MAX_FF)
    n_layers: int = spec(6, ge=1, le=MAX_LAYERS)
    max_len: int = spec(512, ge=1, le=MAX_LEN)
    type_vocab: int = spec(2, ge=1, le=MAX_TYPE_VOCAB)

    def encoder_config(self) -> TransformerConfig:
        """The config the encoder classes (:class:`EncoderModel`) read."""
        raise NotImplementedError

    @classmethod
    def tiny(cls, **changes: Any) -> Self:
        """A small model for tests and smoke runs (a classifier: use ``shapes="auto"``)."""
        base = {
            "vocab_size": 100,
            "d_model": 32,
            "n_heads": 4,
            "d_ff": 64,
            "n_layers": 2,
            "max_len": 64,
        }
        return cls(**{**base, **changes})


@dataclass(frozen=True)
class TransformerConfig(EncoderSizes):
    """Sizes of the encoder classifier; the defaults are the MNLI model of the paper."""

    num_classes: int = spec(3, ge=1, le=MAX_CLASSES)
    dropout: float = spec(0.1, ge=0, lt=1)
    attn_dropout: float = spec(0.1, ge=0, lt=1)
    ln_eps: float = spec(1e-9, gt=0, le=1)
    recompute: bool = False  # training: keep only each block's input, rerun the block backward
    # training: keep TT-linear outputs as rank-r factors, attention probabilities not at all
    # (both rebuilt in backward, engine.contract.lowrank_saved)
    recompute_tt_outputs: bool = False
    # with recompute_tt_outputs: rebuild the attention probabilities too (False keeps them:
    # one (B, H, S, S) float tensor per layer, for one q k^T and softmax less in backward)
    recompute_attention: bool = True
    version: int = spec(CONFIG_VERSION, choices=(CONFIG_VERSION,))

    def __post_init__(self) -> None:
        validate(self)
        if self.d_model % self.n_heads:
            raise ConfigError(
                "d_model", f"must be divisible by n_heads, got {self.d_model} and {self.n_heads}"
            )

    def encoder_config(self) -> TransformerConfig:
        return self

    @classmethod
    def mnli(cls, **changes: Any) -> TransformerConfig:
        """The paper's six-encoder MNLI model (docs/method.md#paper-shapes)."""
        return cls(**changes)


# -- modules, small to large ----------------------------------------------------------------
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


class Classifier(nn.Module):
    def __init__(self, cfg: TransformerConfig, make_linear: MakeLinear) -> None:
        super().__init__()
        self.fc1 = make_linear("cls1", cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.fc2 = nn.Linear(cfg.d_model, cfg.num_classes)  # always dense

    def forward(self, first: Tensor) -> Tensor:
        h = dropout(torch.tanh(self.fc1(first)), self.drop.p, self.training)  # (B, D)
        return self.fc2(h)  # (B, C)


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


class TransformerClassifier(EncoderModel):
    """``(input_ids (B,S), token_type_ids, attention_mask) -> logits (B, classes)``."""

    config: TransformerConfig

    def add_head(self, cfg: TransformerConfig, make_linear: MakeLinear) -> None:
        self.classifier = Classifier(cfg, make_linear)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        lowrank = self.training and torch.is_grad_enabled() and self.config.recompute_tt_outputs
        with recompute_tt_outputs() if lowrank else contextlib.nullcontext():
            x = self.encode(input_ids, attention_mask, token_type_ids)  # (B, S, D)
            return self.classifier(x[:, 0])  # (B, C)


# -- builders -------------------------------------------------------------------------------
def _check_mnli(cfg: TransformerConfig) -> None:
    rows = math.prod(MNLI_SHAPES["embedding"][0])
    if cfg.d_model != 768 or cfg.d_ff != 3072 or cfg.vocab_size > rows:
        raise ValueError(
            f"shapes='mnli' needs d_model=768, d_ff=3072 and vocab_size <= {rows}; got "
            f"{cfg.d_model}, {cfg.d_ff}, {cfg.vocab_size} (use shapes='auto')"
        )


def _mnli_specialize(embedding_max_rank: int | None) -> Specialize:
    """Exact paper shapes per role (docs/method.md#paper-shapes); embedding ranks 32 unless
    capped explicitly."""

    def specialize(name: str, slot: Slot) -> dict[str, Any]:
        if slot.kind == "embedding":
            rows, cols, ranks = MNLI_SHAPES["embedding"]
            if embedding_max_rank is None:
                return {"row_modes": rows, "col_modes": cols, "ranks": ranks, "d": None}
            return {"row_modes": rows, "col_modes": cols, "max_rank": embedding_max_rank, "d": None}
        if slot.role not in MNLI_SHAPES:
            raise ValueError(f"shapes='mnli' has no shapes for {name!r} (role {slot.role!r})")
        in_modes, out_modes = MNLI_SHAPES[slot.role]
        return {"in_modes": in_modes, "out_modes": out_modes, "d": None}

    return specialize


# the layer factories of the encoder models' tensorized builds: every slot named by its role
ENCODER_SLOTS = (
    lambda role, n_in, n_out: linear_slot(n_in, n_out, role=role),
    lambda num, dim: embedding_slot(num, dim, role="embedding"),
)
PAPER_OPTIONS = TensorizeOptions(shapes="paper")
_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(TensorizeOptions))


def _keyword_options(
    options: TensorizeOptions | None, keywords: dict[str, Any]
) -> TensorizeOptions:
    """``options``, or the keyword form of earlier releases read into them (``max_rank=4,
    shapes="auto"``; there ``shapes`` is ``"mnli"`` or ``"auto"``)."""
    if not keywords:
        return options if options is not None else PAPER_OPTIONS
    if options is not None:
        raise TypeError("build_transformer() takes options or their keywords, not both")
    shapes = keywords.pop("shapes", "mnli")
    if shapes not in ("mnli", "auto"):
        raise ValueError(f"shapes must be 'mnli' or 'auto', got {shapes!r}")
    return TensorizeOptions(shapes="paper" if shapes == "mnli" else "auto", **keywords)


def build_transformer(
    config: TransformerConfig,
    *,
    tensorized: bool,
    options: TensorizeOptions | None = None,
    **keywords: Any,
) -> TransformerClassifier:
    """Dense model, or the CoMERA model built directly in TT / TTM form (random init).

    Tensorizable layers: ``embeddings.word`` (TTM), every encoder linear
    (``encoder.<i>.attn.{q,k,v,out}``, ``encoder.<i>.ffn.{fc1,fc2}``) and ``classifier.fc1``
    (TT); one is tensorized when it matches a ``layers`` pattern and has at least ``min_size``
    dense weight entries (see :mod:`engine.models.tensorize`), the others stay dense and are
    listed in ``model.tensorize_report``. ``options`` default to :data:`PAPER_OPTIONS`.
    ``options.shapes="paper"``: docs/method.md#paper-shapes (TT ranks ``max_rank`` capped by the
    bond bounds, embedding ranks fixed at 32 unless ``embedding_max_rank`` is given; ``d`` must
    be ``None``). ``"auto"``: automatic modes with ``d`` modes per side (per-size default when
    ``None``), ``max_rank`` for the linears and ``embedding_max_rank`` (default ``max_rank``)
    for the embedding. ``gate_threshold`` goes to every TT / TTM layer.

    ``keywords``: the fields of :class:`~engine.models.tensorize.TensorizeOptions` one by one
    instead of ``options`` (``max_rank=4, shapes="auto"``, with ``shapes`` ``"mnli"`` for
    ``"paper"``), the form of earlier releases.
    """
    unknown = sorted(set(keywords) - _OPTION_NAMES)
    if unknown:
        raise TypeError(f"build_transformer() got unexpected keyword arguments {unknown}")
    specialize = None
    if tensorized:
        options = _keyword_options(options, keywords)
        if options.shapes == "paper":
            _check_mnli(config)
            if options.d is not None:
                raise ValueError(
                    f"d must be None with shapes='mnli' (its modes are fixed), got {options.d}; "
                    "use shapes='auto'"
                )
            specialize = _mnli_specialize(options.embedding_max_rank)
    return build_model(
        TransformerClassifier,
        config,
        tensorized=tensorized,
        options=options,
        slots=ENCODER_SLOTS,
        specialize=specialize,
    )


@dataclass(frozen=True)
class ParameterReport:
    """Parameter counts of a (possibly tensorized) model; ``other`` includes TT biases."""

    total: int
    tt_cores: int  # TT / TTM core entries
    gates: int  # rank-gate entries
    other: int  # everything else: dense layers, biases, LayerNorms, position embeddings
    tensorized_dense: int  # dense weight entries the TT / TTM layers stand in for
    tensorized_layers: int

    @property
    def tensorized_ratio(self) -> float:
        """Dense weight entries over core entries, tensorized layers only."""
        return math.inf if self.tt_cores == 0 else self.tensorized_dense / self.tt_cores

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["tensorized_ratio"] = self.tensorized_ratio
        return out


def parameter_report(model: nn.Module) -> ParameterReport:
    """Exact counts for any model holding ``TTLinear`` / ``TTMEmbedding`` modules."""
    total = sum(p.numel() for p in model.parameters())
    tt = [m for m in model.modules() if isinstance(m, TTLinear | TTMEmbedding)]
    cores = sum(p.numel() for m in tt for p in m.cores)
    gates = sum(p.numel() for m in tt for p in m.gates)
    return ParameterReport(
        total=total,
        tt_cores=cores,
        gates=gates,
        other=total - cores - gates,
        tensorized_dense=sum(m.dense_parameters() for m in tt),
        tensorized_layers=len(tt),
    )
