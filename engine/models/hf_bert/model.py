"""The ``hf_bert`` encoder on transformers' own ``BertModel``: the student and its teacher.

transformers does the modeling. :class:`BertEncoder` holds a ``transformers.BertModel``
(built without its pooler) and exposes its two children, ``embeddings`` and ``encoder``, as
its own, so module and state-dict names are transformers' (``embeddings.word_embeddings``,
``encoder.layer.<i>.attention.self.query``, ``encoder.layer.<i>.intermediate.dense``, ...)
and a layer swapped in below them (a TT linear) is the one ``BertModel.forward`` runs. The
``BertModel`` itself is kept outside the module tree (it owns the same children, so it adds
no parameters); :meth:`BertEncoder.forward` calls it and returns the last hidden state.

The original's weights are read by ``BertModel.from_pretrained`` (safetensors only, local
files only, never remote code; a missing weight is an error, not a random start).
:class:`SentenceEncoder` is the student: it also holds, outside its module tree (no
parameters, no state-dict entries), the frozen dense teacher that
:func:`engine.models.hf_bert.distill.distill_loss` compares it with, and the teacher's
embeddings of the training split (:mod:`engine.models.hf_bert.cache`).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from engine.models.frozen_teacher import WithTeacher
from engine.models.hf_bert.config import BertArchitecture, HFBertConfig
from engine.models.hf_bert.pooling import mean_pool

__all__ = ["BertEncoder", "SentenceEncoder", "load_pretrained", "bert_model", "ENCODER_LINEARS"]

# the linears of one BERT layer, below ``encoder.layer.<i>``, in data-flow order
ENCODER_LINEARS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)

_UNUSED = re.compile(r"^(bert\.)?(pooler\.|cls\.)|(^|\.)position_ids$")  # read, never used


def bert_model(arch: BertArchitecture, dropout: float = 0.0) -> nn.Module:
    """transformers' ``BertModel`` of ``arch`` (random weights, no pooler), float32."""
    from transformers import BertModel

    return BertModel(arch.transformers_config(dropout), add_pooling_layer=False).float()


class BertEncoder(nn.Module):
    """``(input_ids (B,S), attention_mask, token_type_ids) -> last hidden state (B, S, D)``."""

    def __init__(self, arch: BertArchitecture, dropout: float = 0.0, bert: Any = None) -> None:
        super().__init__()
        self.arch = arch
        bert = bert_model(arch, dropout) if bert is None else bert
        self.__dict__["bert"] = bert  # owns the same two children: no second registration
        self.embeddings = bert.embeddings
        self.encoder = bert.encoder

    @property
    def bert(self) -> nn.Module:
        return self.__dict__["bert"]

    def train(self, mode: bool = True) -> BertEncoder:
        super().train(mode)
        self.bert.training = mode  # the children follow through super(); the root here
        return self

    def __deepcopy__(self, memo: dict) -> BertEncoder:
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)  # children shared with bert stay so
        return new

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (B, S), got shape {tuple(input_ids.shape)}")
        limit = self.arch.max_position_embeddings
        if input_ids.shape[1] > limit:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} > max_position_embeddings {limit}"
            )
        mask = None if attention_mask is None else attention_mask.long()  # (B, S)
        out = self.bert(input_ids=input_ids, attention_mask=mask, token_type_ids=token_type_ids)
        return out.last_hidden_state  # (B, S, D)


class SentenceEncoder(BertEncoder, WithTeacher):
    """The student encoder; ``teacher`` is the frozen original (``None`` when built bare).

    The teacher is kept outside the module tree, so it adds no parameters, optimizer state
    or checkpoint entries; ``.to()`` / ``.double()`` move it along with the student.
    """

    def __init__(self, arch: BertArchitecture, config: HFBertConfig, bert: Any = None) -> None:
        super().__init__(arch, config.dropout, bert)
        self.config = config

    def cached_distillation(self) -> tuple[int, Any] | None:
        """With ``cosine_embedding`` the loss reads only the teacher's mean-pooled embedding."""
        teacher = self.teacher
        if teacher is None or self.config.distill != "cosine_embedding":
            return None
        return int(self.arch.hidden_size), lambda ids, mask, types: mean_pool(
            teacher(ids, mask, types), mask
        )

    def embed(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Sentence embeddings ``(B, D)`` (mean pooling)."""
        return mean_pool(self(input_ids, attention_mask, token_type_ids), attention_mask)


def load_pretrained(directory: Path, arch: BertArchitecture) -> BertEncoder:
    """The dense encoder of ``directory`` (``model.safetensors``), in eval mode, float32."""
    from transformers import BertModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    origin = directory / "model.safetensors"
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the unused pooler / MLM head weights are not news
    try:
        bert, info = BertModel.from_pretrained(
            str(directory),
            config=arch.transformers_config(),
            add_pooling_layer=False,
            use_safetensors=True,
            local_files_only=True,
            dtype=torch.float32,
            output_loading_info=True,
        )
    except (OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"path: transformers cannot load {origin} ({err})") from None
    finally:
        logging.set_verbosity(verbosity)
    foreign = [k for k in info.get("unexpected_keys") or [] if not _UNUSED.search(k)]
    if foreign:
        raise ValueError(
            f"path: model.safetensors holds {foreign[0]!r}, which is not a BERT encoder "
            f"weight (unsupported architecture)"
        )
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise ValueError(
            f"path: {origin} lacks weights for {missing[:6]} "
            f"({len(missing)} missing; does config.json match the weights?)"
        )
    wrong = info.get("mismatched_keys") or []
    if wrong:
        raise ValueError(f"path: {origin} has weights of the wrong shape: {list(wrong)[:4]}")
    return BertEncoder(arch, bert=bert.float()).eval()
