"""The Hugging Face model families the ``hf`` workload builds, and what it tensorizes in each.

One row per ``config.json`` ``model_type``: the linear layers of its transformer blocks (names
as ``transformers`` gives them, matched as the last components of a module name), the name of
its output projection (``lm_head``: tensorized only on request), the tasks its Auto classes
offer, and the ``config.json`` fields that size its weights (each bounded, so a config asking
for a billion layers is refused before anything is built). Only these model types are
accepted: a directory's own modeling code is never loaded (``trust_remote_code`` is never set).

GPT-2 keeps its weights in ``transformers.pytorch_utils.Conv1D``, stored ``(in, out)``: the
transpose of ``nn.Linear``'s ``(out, in)``; :mod:`engine.models.hf.swap` transposes.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.hf_bert.model import ENCODER_LINEARS

__all__ = ["Family", "FAMILIES", "TASKS", "family_of", "SIZE_BOUNDS", "DROPOUT_FIELDS"]

# task -> the Auto class that builds it (sentence_embedding: the bare encoder / decoder)
TASKS = {
    "causal_lm": "AutoModelForCausalLM",
    "masked_lm": "AutoModelForMaskedLM",
    "sequence_classification": "AutoModelForSequenceClassification",
    "sentence_embedding": "AutoModel",
}

_BERT_LINEARS = ENCODER_LINEARS  # one BERT layer's linears, hf_bert's own list
_LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ENCODER_TASKS = ("masked_lm", "sequence_classification", "sentence_embedding")
_DECODER_TASKS = ("causal_lm", "sequence_classification", "sentence_embedding")


@dataclass(frozen=True)
class Family:
    """What the workload knows of one ``model_type``."""

    model_type: str
    linears: tuple[str, ...]  # module-name suffixes of the blocks' linear layers
    lm_heads: tuple[str, ...]  # module names of the output projection (one per task class)
    tasks: tuple[str, ...]
    layers_field: str  # config.json field: number of blocks
    hidden_field: str  # config.json field: model width
    token_types: bool = False  # whether the model takes token_type_ids (BERT's segments)

    def is_target(self, name: str) -> bool:
        """Whether module ``name`` is one of the family's block linears."""
        return any(name == s or name.endswith("." + s) for s in self.linears)


def _llama_like(model_type: str) -> Family:
    return Family(
        model_type, _LLAMA_LINEARS, ("lm_head",), _DECODER_TASKS, "num_hidden_layers", "hidden_size"
    )


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family(
            "bert",
            _BERT_LINEARS,
            ("cls.predictions.decoder",),
            _ENCODER_TASKS,
            "num_hidden_layers",
            "hidden_size",
            token_types=True,
        ),
        Family(
            "roberta",
            _BERT_LINEARS,
            ("lm_head.decoder",),
            _ENCODER_TASKS,
            "num_hidden_layers",
            "hidden_size",
        ),
        Family(
            "distilbert",
            ("q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"),
            ("vocab_projector",),
            _ENCODER_TASKS,
            "n_layers",
            "dim",
        ),
        Family(
            "gpt2", ("c_attn", "c_proj", "c_fc"), ("lm_head",), _DECODER_TASKS, "n_layer", "n_embd"
        ),
        _llama_like("llama"),
        _llama_like("mistral"),
        _llama_like("qwen2"),
    )
}

# config.json fields that hold a dropout probability, over the families: BERT / RoBERTa,
# DistilBERT, GPT-2, the LLaMA family's attention dropout and the classification heads'
DROPOUT_FIELDS = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "dropout",
    "attention_dropout",
    "seq_classif_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "summary_first_dropout",
)

# config.json fields that size the weights: upper bounds (integers >= 1 when present)
SIZE_BOUNDS = {
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


def family_of(model_type: object) -> Family:
    """The family of ``model_type``; anything else is a ``ValueError`` listing the known."""
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ValueError(
            f"model_type must be one of {sorted(FAMILIES)} (the families this engine builds "
            f"with transformers' own classes), got {model_type!r}"
        )
    return family
