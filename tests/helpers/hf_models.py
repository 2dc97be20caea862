"""Tiny Hugging Face models of each family, built offline: ``from_config`` + ``save_pretrained``.

Every directory holds ``config.json``, ``model.safetensors`` and a ``tokenizer.json``: a BERT
WordPiece tokenizer trained on :data:`TEXT` by the engine's own trainer, of at most
:data:`VOCAB` tokens (every tiny config takes that ``vocab_size``; a 30k vocabulary such as
the shipped MiniLM's would make the output projection most of each step). Nothing is
downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["TINY", "VOCAB", "tiny_config", "make_model_dir", "write_tokenizer", "TEXT"]

VOCAB = 512

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
        "bos_token_id": 2,
        "eos_token_id": 3,
    },
    "llama": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "bos_token_id": 2,
        "eos_token_id": 3,
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
        "bos_token_id": 2,
        "eos_token_id": 3,
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


def write_tokenizer(directory: Path) -> Path:
    """``directory/tokenizer.json``: WordPiece trained on :data:`TEXT` (deterministic)."""
    from engine.data.tokenizer import train_wordpiece

    path = Path(directory) / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    train_wordpiece(TEXT, vocab_size=VOCAB, lowercase=True).save(str(path))
    return path


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
    write_tokenizer(out)
    return out
