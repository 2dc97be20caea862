"""A pretrained Hugging Face BERT encoder in plain torch: the modules and the weights.

The encoder is the engine's own post-LN encoder (``Embeddings`` and ``EncoderBlock`` of
:mod:`engine.models.transformer`), which is BERT's: word + position + token-type embeddings,
LayerNorm; per layer ``x = LN(x + attn(x)); x = LN(x + W2 gelu(W1 x))`` with the erf GELU.
Weights come from ``model.safetensors`` (``safetensors.torch.load_file``) under these names::

    embeddings.{word,position,token_type}_embeddings   -> embeddings.{word,position,token_type}
    embeddings.LayerNorm                                -> embeddings.norm
    encoder.layer.<i>.attention.self.{query,key,value}  -> encoder.<i>.attn.{q,k,v}
    encoder.layer.<i>.attention.output.dense            -> encoder.<i>.attn.out
    encoder.layer.<i>.attention.output.LayerNorm        -> encoder.<i>.norm1
    encoder.layer.<i>.intermediate.dense                -> encoder.<i>.ffn.fc1
    encoder.layer.<i>.output.dense / .LayerNorm         -> encoder.<i>.ffn.fc2 / encoder.<i>.norm2

(a ``bert.`` prefix is stripped; ``pooler.*``, ``cls.*`` and ``position_ids`` are not used).
:class:`SentenceEncoder` holds the student and, outside its module tree (no parameters, no
state-dict entries), the frozen dense teacher that
:func:`engine.models.hf_bert.distill.distill_loss` compares it with, and the teacher's
embeddings of the training split (:mod:`engine.models.hf_bert.cache`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch
from torch import Tensor, nn

from engine.models.hf_bert.config import BertArchitecture, HFBertConfig
from engine.models.hf_bert.pooling import mean_pool
from engine.models.transformer import Embeddings, EncoderBlock, encoder_inputs

if TYPE_CHECKING:
    from engine.models.hf_bert.cache import TeacherEmbeddings

__all__ = [
    "BertEncoder",
    "SentenceEncoder",
    "hf_to_engine_name",
    "load_pretrained",
    "ENCODER_LINEARS",
]

ENCODER_LINEARS = ("attn.q", "attn.k", "attn.v", "attn.out", "ffn.fc1", "ffn.fc2")
_LAYER_NAMES = {
    "attention.self.query": "attn.q",
    "attention.self.key": "attn.k",
    "attention.self.value": "attn.v",
    "attention.output.dense": "attn.out",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn.fc1",
    "output.dense": "ffn.fc2",
    "output.LayerNorm": "norm2",
}
_EMBEDDING_NAMES = {
    "word_embeddings": "word",
    "position_embeddings": "position",
    "token_type_embeddings": "token_type",
    "LayerNorm": "norm",
}
_UNUSED = re.compile(r"^(pooler\.|cls\.)|(^|\.)position_ids$")
_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)$")
_EMBED = re.compile(r"^embeddings\.(\w+)\.(weight|bias|gamma|beta)$")
_LEAF = {"gamma": "weight", "beta": "bias"}  # names of old TF-converted LayerNorms


class BertEncoder(nn.Module):
    """``(input_ids (B,S), attention_mask, token_type_ids) -> last hidden state (B, S, D)``."""

    def __init__(self, arch: BertArchitecture, dropout: float = 0.0) -> None:
        super().__init__()
        self.arch = arch
        enc = arch.encoder_config(dropout)

        def word(num: int, dim: int) -> nn.Embedding:
            return nn.Embedding(num, dim, padding_idx=arch.pad_token_id)

        self.embeddings = Embeddings(enc, word)
        self.encoder = nn.ModuleList(
            [EncoderBlock(enc, lambda role, i, o: nn.Linear(i, o)) for _ in range(enc.n_layers)]
        )

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        token_type_ids, keep = encoder_inputs(
            input_ids,
            token_type_ids,
            attention_mask,
            self.arch.max_position_embeddings,
            "max_position_embeddings",
        )
        x = self.embeddings(input_ids, token_type_ids)  # (B, S, D)
        for block in self.encoder:
            x = block(x, keep)  # (B, S, D)
        return x


class SentenceEncoder(BertEncoder):
    """The student encoder; ``teacher`` is the frozen original (``None`` when built bare).

    The teacher is kept outside the module tree, so it adds no parameters, optimizer state
    or checkpoint entries; ``.to()`` / ``.double()`` move it along with the student.
    """

    def __init__(self, arch: BertArchitecture, config: HFBertConfig) -> None:
        super().__init__(arch, config.dropout)
        self.config = config
        self.__dict__["teacher"] = None
        self.__dict__["teacher_embeddings"] = None

    @property
    def teacher_embeddings(self) -> TeacherEmbeddings | None:
        """The training split's teacher embeddings (:mod:`engine.models.hf_bert.cache`)."""
        return self.__dict__["teacher_embeddings"]

    def set_teacher_embeddings(self, table: TeacherEmbeddings | None) -> None:
        self.__dict__["teacher_embeddings"] = table

    @property
    def teacher(self) -> BertEncoder | None:
        return self.__dict__["teacher"]

    def set_teacher(self, teacher: BertEncoder | None) -> None:
        if teacher is not None:
            teacher.eval().requires_grad_(False)
        self.__dict__["teacher"] = teacher

    def _apply(self, fn: Any, recurse: bool = True) -> SentenceEncoder:
        super()._apply(fn, recurse)
        if self.teacher is not None:
            self.teacher._apply(fn, recurse)
        return self

    def embed(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Sentence embeddings ``(B, D)`` (mean pooling)."""
        return mean_pool(self(input_ids, attention_mask, token_type_ids), attention_mask)


# -- weights --------------------------------------------------------------------------------
def hf_to_engine_name(key: str) -> str | None:
    """Our state-dict name of a Hugging Face BERT weight; ``None`` for the unused ones."""
    key = key.removeprefix("bert.")
    if _UNUSED.search(key):
        return None
    if m := _LAYER.match(key):
        i, sub, leaf = m.groups()
        if sub in _LAYER_NAMES:
            return f"encoder.{i}.{_LAYER_NAMES[sub]}.{_LEAF.get(leaf, leaf)}"
    if (m := _EMBED.match(key)) and m.group(1) in _EMBEDDING_NAMES:
        return f"embeddings.{_EMBEDDING_NAMES[m.group(1)]}.{_LEAF.get(m.group(2), m.group(2))}"
    raise ValueError(
        f"path: model.safetensors holds {key!r}, which is not a BERT encoder "
        f"weight (unsupported architecture)"
    )


def _mapped_state(weights: Mapping[str, Tensor], model: nn.Module, origin: Path) -> dict:
    state: dict[str, Tensor] = {}
    for key, value in weights.items():
        name = hf_to_engine_name(key)
        if name is not None:
            state[name] = value
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(
            f"path: {origin} lacks weights for {missing[:6]} "
            f"({len(missing)} missing; does config.json match the weights?)"
        )
    wrong = [
        f"{k}: file {tuple(state[k].shape)}, config.json {tuple(own[k].shape)}"
        for k in own
        if state[k].shape != own[k].shape
    ]
    if wrong:
        raise ValueError(f"path: {origin} has weights of the wrong shape: {wrong[:4]}")
    return {k: state[k].to(torch.float32) for k in own}


def load_pretrained(directory: Path, arch: BertArchitecture) -> BertEncoder:
    """The dense encoder of ``directory`` (``model.safetensors``), in eval mode, float32."""
    origin = directory / "model.safetensors"
    try:
        weights = safetensors.torch.load_file(str(origin))
    except Exception as err:  # safetensors raises its own error types
        raise ValueError(f"path: {origin} is not a readable safetensors file ({err})") from None
    model = BertEncoder(arch)
    model.load_state_dict(_mapped_state(weights, model, origin), strict=True)
    return model.eval()
