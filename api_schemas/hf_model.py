"""The wire form of the ``hf`` workload's model: families, tasks, sizes, from-scratch source.

An ``hf`` job names a Hugging Face model of one of :data:`HF_MODEL_TYPES` (``config.json``'s
``model_type``), compressed for one of :data:`HF_TASKS`:

* pretrained: ``model.source`` of kind ``hf_dir`` (a directory under the data root),
  ``package`` or ``uploaded`` (``POST /v1/models``), as for ``hf_bert``;
* from scratch: ``model.source`` of kind ``hf_config``: the contents of a ``config.json``
  (:class:`HFConfigSource`, at most :data:`MAX_HF_CONFIG_BYTES` as JSON) and the relative
  path of a ``tokenizer.json`` under the data root.

``model.config`` holds the engine's own fields (``task``, ``targets``, ``tensorize_lm_head``,
``tensorize_embeddings``, ``task_weight``, ``export_dense``, ``num_labels``);
``model.distill`` gives ``weight`` and ``temperature`` (the kind of distillation follows the
task, so ``distill.kind`` is not given). The tables here are the engine's
(``engine.models.hf.families``), copied so the API checks them without torch; a test keeps
them equal.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator

from api_schemas.common import StrictModel

__all__ = [
    "HF_MODEL_TYPES",
    "HF_RESERVED",
    "HF_SIZE_BOUNDS",
    "HF_TASKS",
    "HFConfigSource",
    "UploadedSource",
    "MAX_HF_CONFIG_BYTES",
    "relative_path",
]

HF_TASKS = ("causal_lm", "masked_lm", "sequence_classification", "sentence_embedding")
HF_MODEL_TYPES = ("bert", "roberta", "distilbert", "gpt2", "llama", "mistral", "qwen2")
# model types whose inputs are BERT's ([CLS] ... [SEP], [MASK]): their tokenizer must hold them
BERT_TOKEN_TYPES = ("bert", "distilbert")
MAX_HF_CONFIG_BYTES = 256 * 1024
# config.json fields that size the weights: upper bounds (integers >= 1 when present)
HF_SIZE_BOUNDS = {
    "vocab_size": 1_000_000,
    "hidden_size": 16_384,
    "n_embd": 16_384,
    "dim": 16_384,
    "num_hidden_layers": 128,
    "n_layer": 128,
    "n_layers": 128,
    "num_attention_heads": 256,
    "n_head": 256,
    "n_heads": 256,
    "num_key_value_heads": 256,
    "intermediate_size": 65_536,
    "hidden_dim": 65_536,
    "n_inner": 65_536,
    "max_position_embeddings": 131_072,
    "n_positions": 131_072,
    "type_vocab_size": 64,
    "num_labels": 10_000,
}
# engine model.config fields of hf that the spec sets elsewhere (source, distill, dataset)
HF_RESERVED = (
    "path",
    "hf_config",
    "tokenizer",
    "distill_weight",
    "temperature",
    "pad_token_id",
    "mask_token_id",
    "tokenizer_vocab_size",
    "max_len",
    "version",
)


def relative_path(v: str | None) -> str | None:
    """A path relative to a server root: not absolute, no ``..`` segment, no NUL."""
    if v is not None and (v.startswith("/") or ".." in v.split("/") or "\x00" in v):
        raise ValueError("must be a relative path under the data root, without '..'")
    return v


class HFConfigSource(StrictModel):
    """An ``hf`` model trained from scratch: ``config`` is a ``config.json``'s contents
    (``model_type`` one of :data:`HF_MODEL_TYPES`), ``tokenizer`` a ``tokenizer.json`` under
    the data root."""

    kind: Literal["hf_config"]
    config: dict[str, Any]
    tokenizer: str = Field(min_length=1, max_length=1024)

    check_path = field_validator("tokenizer")(relative_path)

    @field_validator("config")
    @classmethod
    def _config(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            text = json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"must be plain JSON ({err})") from None
        if len(text) > MAX_HF_CONFIG_BYTES:
            raise ValueError(f"must be at most {MAX_HF_CONFIG_BYTES} bytes as JSON")
        if v.get("model_type") not in HF_MODEL_TYPES:
            raise ValueError(
                f"model_type must be one of {list(HF_MODEL_TYPES)}, got {v.get('model_type')!r}"
            )
        for name, bound in HF_SIZE_BOUNDS.items():
            value = v.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
                raise ValueError(f"{name} must be an integer in [1, {bound:,}], got {value!r}")
        return v


class UploadedSource(StrictModel):
    """A model directory the tenant uploaded (``POST /v1/models``), by its id."""

    kind: Literal["uploaded"]
    id: str = Field(max_length=64, pattern=r"^mdl_[0-9A-Za-z]+$")
