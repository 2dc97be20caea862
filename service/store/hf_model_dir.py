"""The model directory of an ``hf`` job, checked without torch (family-aware).

:func:`check_hf_files` reads what :mod:`service.store.model_source` found in a directory
(``config.json``, ``model.safetensors``, ``tokenizer.json``):

* ``config.json``: at most ``MAX_CONFIG_BYTES``, nested at most ``json_limits.MAX_DEPTH``
  levels, a JSON object whose ``model_type`` is one of ``api_schemas.hf_model.HF_MODEL_TYPES``,
  every weight-shaping size an integer within ``HF_SIZE_BOUNDS`` (a config asking for a
  billion layers or a 10^12 vocabulary is refused here), no encoder-decoder, and the model it
  describes (:func:`estimate_params`, unset sizes at transformers' defaults) at most
  :data:`MAX_HF_PARAMS` parameters;
* ``model.safetensors``: the header as :func:`service.store.model_files.read_header` checks it
  (dtypes, shapes and byte ranges that cover the file exactly), at most :data:`MAX_HF_PARAMS`
  elements in all, and the input embedding shaped ``[vocab_size, hidden]`` as ``config.json``
  says;
* ``tokenizer.json``: as :func:`service.store.model_files.check_tokenizer`; BERT's special
  tokens are required only of the ``bert`` and ``distilbert`` families.

The planner then builds the architecture on the ``meta`` device (``worker.plan``) and the
worker loads the weights with transformers (safetensors only, never the directory's code).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

from api_schemas.engine_spec import SpecError
from api_schemas.hf_model import BERT_TOKEN_TYPES, HF_MODEL_TYPES, HF_SIZE_BOUNDS
from service.store import json_limits
from service.store.model_files import check_tokenizer, read_header

__all__ = ["MAX_HF_PARAMS", "Sizes", "check_hf_config", "check_hf_files", "estimate_params"]

MAX_HF_PARAMS = 8_000_000_000
MAX_CONFIG_BYTES = 1 << 20
MAX_HEADER_BYTES = 64 << 20
MAX_WEIGHT_BYTES = 4 * MAX_HF_PARAMS + MAX_HEADER_BYTES + 8  # float32 at most


class Sizes(NamedTuple):
    """Per family: the ``config.json`` fields of the vocabulary, width, depth and MLP width,
    transformers' default for each, the input embedding's weight name and whether the MLP is
    gated (three matrices)."""

    fields: tuple[str, str, str, str]
    defaults: tuple[int, int, int, int | None]
    embedding: str
    gated: bool = False


_BERT = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size")
_LLAMA = _BERT
FAMILY_SIZES = {
    "bert": Sizes(_BERT, (30522, 768, 12, 3072), "embeddings.word_embeddings.weight"),
    "roberta": Sizes(_BERT, (50265, 768, 12, 3072), "embeddings.word_embeddings.weight"),
    "distilbert": Sizes(
        ("vocab_size", "dim", "n_layers", "hidden_dim"),
        (30522, 768, 6, 3072),
        "embeddings.word_embeddings.weight",
    ),
    "gpt2": Sizes(
        ("vocab_size", "n_embd", "n_layer", "n_inner"), (50257, 768, 12, None), "wte.weight"
    ),
    "llama": Sizes(_LLAMA, (32000, 4096, 32, 11008), "embed_tokens.weight", gated=True),
    "mistral": Sizes(_LLAMA, (32000, 4096, 32, 14336), "embed_tokens.weight", gated=True),
    "qwen2": Sizes(_LLAMA, (151936, 4096, 32, 22016), "embed_tokens.weight", gated=True),
}


def _sizes(cfg: dict[str, Any]) -> tuple[int, int, int, int]:
    family = FAMILY_SIZES[cfg["model_type"]]
    vocab, hidden, layers, ffn = (
        cfg.get(f) if cfg.get(f) is not None else d
        for f, d in zip(family.fields, family.defaults, strict=True)
    )
    return vocab, hidden, layers, ffn if ffn is not None else 4 * hidden


def estimate_params(cfg: dict[str, Any]) -> int:
    """About the parameters of the model ``cfg`` (a checked ``config.json``) describes: the
    blocks' attention and MLP matrices and the embedding (twice when not tied)."""
    vocab, hidden, layers, ffn = _sizes(cfg)
    gated = FAMILY_SIZES[cfg["model_type"]].gated
    block = 4 * hidden * hidden + (3 if gated else 2) * hidden * ffn
    tied = cfg.get("tie_word_embeddings", not gated)
    return layers * block + vocab * hidden * (1 if tied else 2)


def check_hf_config(data: Any, pointer: str, where: str) -> dict[str, Any]:
    """A parsed ``config.json`` (module doc); ``where`` names it in messages."""
    if not isinstance(data, dict):
        raise SpecError(pointer, f"{where} must hold a JSON object")
    if data.get("model_type") not in HF_MODEL_TYPES:
        raise SpecError(
            pointer,
            f"{where}: model_type must be one of {list(HF_MODEL_TYPES)}, "
            f"got {json.dumps(data.get('model_type'))[:40]}",
        )
    for name, high in HF_SIZE_BOUNDS.items():
        v = data.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= high):
            raise SpecError(
                pointer,
                f"{where}: {name} must be an integer in [1, {high:,}], got {json.dumps(v)[:40]}",
            )
    if data.get("is_encoder_decoder") or data.get("add_cross_attention"):
        raise SpecError(pointer, f"{where}: encoder-decoder models are not supported")
    params = estimate_params(data)
    if params > MAX_HF_PARAMS:
        raise SpecError(
            pointer,
            f"{where} describes about {params:,} parameters; at most {MAX_HF_PARAMS:,} "
            "are accepted",
        )
    return data


def read_config_json(file: Path, pointer: str, where: str) -> Any:
    """The JSON value in the ``config.json`` ``file`` (at most ``MAX_CONFIG_BYTES``, nested at
    most ``json_limits.MAX_DEPTH``); ``where`` names it in messages."""
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise SpecError(pointer, f"{where} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        return json_limits.loads(file.read_bytes())
    except ValueError as err:  # not JSON, not UTF-8, or nested deeper than MAX_DEPTH
        raise SpecError(pointer, f"{where} is not valid JSON ({err})") from None


def _read_config(file: Path, pointer: str, where: str) -> dict[str, Any]:
    return check_hf_config(read_config_json(file, pointer, where), pointer, where)


def _check_weights(file: Path, pointer: str, where: str, cfg: dict[str, Any]) -> None:
    size = file.stat().st_size
    if size > MAX_WEIGHT_BYTES:
        raise SpecError(pointer, f"{where} is larger than {MAX_WEIGHT_BYTES:,} bytes")
    header = read_header(file, pointer, where, MAX_HEADER_BYTES)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    total = sum(math.prod(v["shape"]) for v in tensors.values())
    if total > MAX_HF_PARAMS:
        raise SpecError(
            pointer, f"{where} holds {total:,} weights; at most {MAX_HF_PARAMS:,} are accepted"
        )
    vocab, hidden, _, _ = _sizes(cfg)
    suffix = FAMILY_SIZES[cfg["model_type"]].embedding
    found = [v["shape"] for k, v in tensors.items() if k == suffix or k.endswith("." + suffix)]
    if found != [[vocab, hidden]]:
        got = found[0] if len(found) == 1 else ("missing" if not found else f"{len(found)} tensors")
        raise SpecError(
            pointer,
            f"{where} does not match config.json: the input embedding {suffix} is {got}, "
            f"config.json says {[vocab, hidden]}",
        )


def check_hf_files(files: dict[str, Path], pointer: str, shown: str) -> str:
    """The three files of an ``hf`` model directory (module doc); returns its ``model_type``.
    ``shown``: the directory's name in messages."""
    cfg = _read_config(files["config.json"], pointer, f"{shown}/config.json")
    _check_weights(files["model.safetensors"], pointer, f"{shown}/model.safetensors", cfg)
    check_tokenizer(
        files["tokenizer.json"],
        pointer,
        f"{shown}/tokenizer.json",
        bert_tokens=cfg["model_type"] in BERT_TOKEN_TYPES,
    )
    return str(cfg["model_type"])
