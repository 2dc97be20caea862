"""An ``hf_bert`` job's ``model.config`` as the ``hf`` workload's: the same recipe on
transformers' Auto classes.

Every choice of the ``hf_bert`` sentence-encoder recipe has its ``hf`` field: the pooled
cosine distillation is ``task: "sentence_embedding"``; the start (``init``,
``calibration_sentences``), the allocation (``rank_allocation``, ``target_compression``,
``probe_sentences``, ``depth_gain``), the embeddings (``tensorize_embeddings``,
``train_embeddings``) and ``dropout`` (``hf_bert``'s default 0, written out: ``hf`` otherwise
keeps the config.json's) carry over by name. On the same sentences the two starts are the
same model (``tests/engine/models/hf/test_encoder_recipe.py``). What ``hf`` does not offer
is refused with the field: the ``mse_hidden`` and ``none`` distillations, a bare
``architecture`` without a ``path`` (a checkpoint of an ``hf_bert`` job loads through
``hf_bert``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.configs import ConfigError
from engine.models.hf_bert.config import HFBertConfig

__all__ = ["hf_bert_to_hf"]

# the fields both configs share, by name
_SAME = (
    "path",
    "tensorize_embeddings",
    "train_embeddings",
    "distill_weight",
    "dropout",
    "init",
    "calibration_sentences",
    "rank_allocation",
    "target_compression",
    "probe_sentences",
    "depth_gain",
)


def hf_bert_to_hf(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``hf`` ``model.config`` of the ``hf_bert`` one ``config`` (validated first, so
    defaults are filled in and errors name ``hf_bert``'s fields)."""
    cfg = HFBertConfig.from_dict(dict(config))
    if cfg.path is None:
        raise ConfigError("path", "is required: hf builds the original from its directory")
    if cfg.distill != "cosine_embedding":
        raise ConfigError(
            "distill",
            f"{cfg.distill!r} has no hf counterpart (hf's sentence_embedding task distils the "
            "pooled cosine, 'cosine_embedding')",
        )
    out = {"task": "sentence_embedding"}
    out.update({name: getattr(cfg, name) for name in _SAME})
    return out
