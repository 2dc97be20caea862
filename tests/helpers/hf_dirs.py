"""Small Hugging Face BERT directories for the service and worker tests (pytest-free).

:func:`write_bert_dir` writes ``config.json``, ``model.safetensors`` (random weights under the
names ``transformers.BertModel`` saves, written with ``safetensors.torch``, no
``transformers`` import: milliseconds, not seconds) and the MiniLM ``tokenizer.json`` (so the
vocabulary is 30522). :func:`write_bin_only_dir` is the same directory with pickled weights
only (a tripwire pickle), which the service must refuse without ever unpickling.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.models.hf_bert.model import ENCODER_LINEARS
from tests.helpers.hf_bert import minilm_dir

__all__ = ["BLOCK_LINEARS", "SIZES", "bert_config", "write_bert_dir", "write_bin_only_dir"]

SIZES = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
# BertModel's names of the six linears of an encoder block
BLOCK_LINEARS = ENCODER_LINEARS
VOCAB = 30522  # the MiniLM tokenizer's


def bert_config(**changes: Any) -> dict[str, Any]:
    """A ``config.json`` of a BERT encoder (``SIZES``, MiniLM vocabulary) with ``changes``."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "vocab_size": VOCAB,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        **SIZES,
        **changes,
    }


def _weights(cfg: dict[str, Any], g: torch.Generator) -> dict[str, torch.Tensor]:
    h, f = cfg["hidden_size"], cfg["intermediate_size"]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05  # like BERT's 0.02 init, a bit wider

    def norm(prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}.weight": 1 + rand(h), f"{prefix}.bias": rand(h)}

    out = {
        "embeddings.word_embeddings.weight": rand(cfg["vocab_size"], h),
        "embeddings.position_embeddings.weight": rand(cfg["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": rand(cfg["type_vocab_size"], h),
        **norm("embeddings.LayerNorm"),
        "pooler.dense.weight": rand(h, h),
        "pooler.dense.bias": rand(h),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        shapes = dict.fromkeys(BLOCK_LINEARS, (h, h)) | {
            "intermediate.dense": (f, h),
            "output.dense": (h, f),
        }
        for name, (o, n) in shapes.items():
            out[f"{p}.{name}.weight"], out[f"{p}.{name}.bias"] = rand(o, n), rand(o)
        out |= norm(f"{p}.attention.output.LayerNorm") | norm(f"{p}.output.LayerNorm")
    return out


def write_bert_dir(directory: Path, seed: int = 0, **changes: Any) -> Path:
    """A random BERT encoder directory (``config.json``, ``model.safetensors``,
    ``tokenizer.json``); ``changes`` go into ``config.json`` and the weight shapes."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = bert_config(**changes)
    g = torch.Generator().manual_seed(seed)
    save_file(_weights(cfg, g), str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.copy(minilm_dir() / "tokenizer.json", directory / "tokenizer.json")
    return directory


class _Tripwire:
    """Unpickling this creates ``marker``: proof that someone unpickled the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (str(self.marker), "w")


def write_bin_only_dir(directory: Path, marker: Path) -> Path:
    """``config.json``, ``tokenizer.json`` and a pickled ``pytorch_model.bin`` that creates
    ``marker`` if it is ever unpickled (the service must refuse it unread)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(bert_config()))
    shutil.copy(minilm_dir() / "tokenizer.json", directory / "tokenizer.json")
    (directory / "pytorch_model.bin").write_bytes(pickle.dumps(_Tripwire(marker)))
    return directory
