"""The encoder's configs: :class:`EncoderSizes`, the leading fields the classifier and the MLM
share, and :class:`TransformerConfig`, the sentence-pair classifier's sizes (the defaults are the
paper's MNLI model, docs/method.md#paper-shapes), which the encoder modules of
:mod:`engine.models.encoder` read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from engine.configs import ConfigError, ConfigMethods, spec, validate
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

__all__ = ["EncoderSizes", "TransformerConfig"]

CONFIG_VERSION = 1


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
