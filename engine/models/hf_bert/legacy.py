"""Checkpoints of the earlier hand-written encoder, read by the encoder on ``BertModel``.

``hf_bert`` first ran on an encoder of its own whose modules had short names
(``encoder.<i>.attn.q``, ``encoder.<i>.norm1``, ``embeddings.word``); it now runs on
transformers' ``BertModel``, whose names are transformers' own
(``encoder.layer.<i>.attention.self.query``, ``encoder.layer.<i>.attention.output.LayerNorm``,
``embeddings.word_embeddings``). The maths of the two is the same, so a checkpoint written
under the short names is the same model under other keys: :func:`upgrade_names` renames its
weights and the layer rows of its manifest, and ``engine.export.load_compressed`` calls it
(through :meth:`engine.models.workload.Workload.upgrade_checkpoint`) before it builds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

__all__ = ["is_legacy", "new_name", "upgrade_names"]

# the earlier encoder's block modules -> BertLayer's
_BLOCK = {
    "attn.q": "attention.self.query",
    "attn.k": "attention.self.key",
    "attn.v": "attention.self.value",
    "attn.out": "attention.output.dense",
    "norm1": "attention.output.LayerNorm",
    "ffn.fc1": "intermediate.dense",
    "ffn.fc2": "output.dense",
    "norm2": "output.LayerNorm",
}
# the earlier encoder's embedding modules -> BertEmbeddings'
_EMBEDDINGS = {
    "word": "word_embeddings",
    "position": "position_embeddings",
    "token_type": "token_type_embeddings",
    "norm": "LayerNorm",
}
_BLOCK_KEY = re.compile(r"^encoder\.(\d+)\.(attn\.\w+|ffn\.\w+|norm[12])(\..+)?$")
_EMBED_KEY = re.compile(r"^embeddings\.(word|position|token_type|norm)(\..+)?$")


def new_name(name: str) -> str:
    """``BertModel``'s name of the earlier encoder's module or weight ``name`` (unchanged when
    it is not one of the earlier names)."""
    if (m := _BLOCK_KEY.match(name)) and m.group(2) in _BLOCK:
        i, module, rest = m.groups()
        return f"encoder.layer.{i}.{_BLOCK[module]}{rest or ''}"
    if m := _EMBED_KEY.match(name):
        module, rest = m.groups()
        return f"embeddings.{_EMBEDDINGS[module]}{rest or ''}"
    return name


def is_legacy(tensors: Mapping[str, Tensor]) -> bool:
    """Whether a checkpoint's weights carry the earlier encoder's names (its embeddings'
    layer norm is the one weight every such checkpoint has)."""
    return "embeddings.norm.weight" in tensors


def upgrade_names(
    manifest: Mapping[str, Any], tensors: Mapping[str, Tensor]
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(manifest, tensors)`` under ``BertModel``'s names; a checkpoint already under them is
    returned as it is (copies of the mappings, the tensors shared)."""
    if not is_legacy(tensors):
        return dict(manifest), dict(tensors)
    layers = [{**row, "name": new_name(row["name"])} for row in manifest.get("layers", [])]
    renamed = {new_name(k): v for k, v in tensors.items()}
    if len(renamed) != len(tensors):  # two earlier names cannot meet under one new name
        raise ValueError("model.safetensors: the earlier encoder's names collide when renamed")
    return {**manifest, "layers": layers}, renamed
