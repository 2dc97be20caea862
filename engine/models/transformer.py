"""The paper's sentence-pair classifier: six post-LN encoder blocks, dense or tensorized.

Architecture as in the authors' code (docs/method.md#paper-shapes): word + learned position +
token-type embeddings, LayerNorm, dropout; post-LN blocks (residual, then LayerNorm, eps 1e-9) with
GELU FFN; the classifier reads the first token: fc1 (d -> d) -> tanh -> dropout -> fc2 (d -> C).

``build_transformer(config, tensorized=True)`` builds the CoMERA model directly with random init
(training from scratch): every encoder linear and the classifier fc1 are ``TTLinear``, the word
embedding is ``TTMEmbedding``; classifier fc2, position / token-type embeddings and LayerNorms stay
dense. ``options.shapes="paper"`` (the default here) uses the exact shapes of
docs/method.md#paper-shapes.

Its parts, each re-exported here: the configs (:mod:`engine.models.encoder_config`), the encoder
trunk the MLM shares (:mod:`engine.models.encoder`) and the parameter counts
(:mod:`engine.models.parameter_report`); this module holds the classifier head and the builders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import torch
from torch import Tensor, nn

from engine.contract.lowrank_saved import recompute_tt_outputs
from engine.models.encoder import (
    ENCODER_SLOTS,
    EncoderBlock,
    EncoderModel,
    MakeEmbedding,
    MakeLinear,
    encoder_inputs,
)
from engine.models.encoder_config import EncoderSizes, TransformerConfig
from engine.models.parameter_report import ParameterReport, parameter_report
from engine.models.tensorize import Slot, Specialize, TensorizeOptions, build_model
from engine.nn.dropout import dropout

__all__ = [
    "TransformerConfig",
    "TransformerClassifier",
    "build_transformer",
    "ParameterReport",
    "parameter_report",
    "MNLI_SHAPES",
    # re-exported from the modules they moved to (engine.models.encoder, .encoder_config)
    "ENCODER_SLOTS",
    "EncoderBlock",
    "EncoderModel",
    "EncoderSizes",
    "MakeEmbedding",
    "MakeLinear",
    "encoder_inputs",
]

# docs/method.md#paper-shapes: (in_modes, out_modes) per role; embedding rows, cols and fixed ranks
MNLI_SHAPES: dict[str, Any] = {
    "attn": ((12, 8, 8), (8, 8, 12)),
    "ffn1": ((12, 8, 8), (12, 16, 16)),
    "ffn2": ((16, 16, 12), (8, 8, 12)),
    "cls1": ((12, 8, 8), (8, 8, 12)),
    "embedding": ((16, 20, 10, 10), (4, 4, 8, 6), (1, 32, 32, 32, 1)),
}


class Classifier(nn.Module):
    def __init__(self, cfg: TransformerConfig, make_linear: MakeLinear) -> None:
        super().__init__()
        self.fc1 = make_linear("cls1", cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.fc2 = nn.Linear(cfg.d_model, cfg.num_classes)  # always dense

    def forward(self, first: Tensor) -> Tensor:
        h = dropout(torch.tanh(self.fc1(first)), self.drop.p, self.training)  # (B, D)
        return self.fc2(h)  # (B, C)


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
