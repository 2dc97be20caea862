"""Tensorizing the encoder: its linears (and optionally the word embedding) as TT layers.

:func:`tensorize_encoder_` swaps every selected encoder ``nn.Linear`` for
``TTLinear.from_linear`` (TT-SVD at ``max_rank``, cores balanced) and, optionally, the word
embedding for ``TTMEmbedding.from_embedding``; :func:`build_hf_bert` builds the student with
the frozen original as its teacher.

Layers carry transformers' names (``encoder.layer.<i>.attention.self.query``). A
``compression.layers`` pattern may also name them as the engine's earlier hand-written encoder
did (``encoder.<i>.attn.q`` / ``attn.k`` / ``attn.v`` / ``attn.out``, ``encoder.<i>.ffn.fc1`` /
``fc2``, ``embeddings.word``; :func:`legacy_name`), so jobs written for it select the same
layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from engine.models.hf_bert.config import HFBertConfig
from engine.models.hf_bert.model import (
    ENCODER_LINEARS,
    BertEncoder,
    SentenceEncoder,
    load_pretrained,
)
from engine.models.hf_bert.whiten import balance_cores_
from engine.models.tensorize import TensorizeOptions, TensorizeReport, require_matches
from engine.nn.meta import on_meta
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.summary import SkippedLayer

__all__ = ["tensorize_encoder_", "swap_to_tt_", "build_hf_bert", "layer_row", "legacy_name"]

WORD_EMBEDDING = "embeddings.word_embeddings"
_OLD = ("attn.q", "attn.k", "attn.v", "attn.out", "ffn.fc1", "ffn.fc2")
_LEGACY = dict(zip(ENCODER_LINEARS, _OLD, strict=True))


def legacy_name(name: str) -> str | None:
    """The earlier hand-written encoder's name of layer ``name`` (``None``: it had none)."""
    if name == WORD_EMBEDDING:
        return "embeddings.word"
    head, _, rest = name.removeprefix("encoder.layer.").partition(".")
    if name.startswith("encoder.layer.") and head.isdigit() and rest in _LEGACY:
        return f"encoder.{head}.{_LEGACY[rest]}"
    return None


def _candidates(model: BertEncoder, embeddings: bool) -> list[tuple[str, nn.Module]]:
    layers = len(model.encoder.layer)
    names = [f"encoder.layer.{i}.{s}" for i in range(layers) for s in ENCODER_LINEARS]
    if embeddings:
        names.insert(0, WORD_EMBEDDING)
    return [(n, model.get_submodule(n)) for n in names]


def layer_row(name: str, layer: TTLinear | TTMEmbedding, dense_weight: Tensor) -> dict:
    """The conversion report of one layer: modes, ranks, sizes, relative weight error."""
    with torch.no_grad():
        approx = layer.to_dense()  # (out, in) or (V, D)
        ref = dense_weight.to(approx.dtype)  # (out, in) or (V, D)
        err = float(torch.linalg.vector_norm(approx - ref) / torch.linalg.vector_norm(ref))
    if isinstance(layer, TTLinear):
        kind, modes = "tt_linear", [list(layer.in_modes), list(layer.out_modes)]
    else:
        kind, modes = "ttm_embedding", [list(layer.row_modes), list(layer.col_modes)]
    return {
        "name": name,
        "kind": kind,
        "modes": modes,
        "ranks": list(layer.ranks),
        "params": layer.tt_parameters(),
        "dense": layer.dense_parameters(),
        "ratio": layer.compression_ratio(),
        "relative_error": err,
    }


def swap_to_tt_(
    root: nn.Module,
    candidates: list[tuple[str, nn.Module]],
    options: TensorizeOptions,
    *,
    where: str,
    from_weights: bool,
    aliases: Mapping[str, str] | None = None,
) -> tuple[TensorizeReport, list[dict[str, Any]]]:
    """Replace the selected ``candidates`` (``(name, nn.Linear | nn.Embedding)`` below
    ``root``) by TT / TTM layers in place; the report and the per-layer rows.

    A layer is converted when it matches one of ``options.layers`` and its dense weight has at
    least ``options.min_size`` entries. ``from_weights``: TT-SVD of the current weights (rows:
    the per-layer modes, ranks, sizes and relative weight error); otherwise fresh layers of the
    same shapes (trained from scratch, or about to receive a checkpoint's weights).
    ``aliases``: a second name per candidate that the ``layers`` patterns may select it by.
    """
    aliases = aliases or {}
    require_matches(options.layers, [*(n for n, _ in candidates), *aliases.values()], where)
    done, skipped, rows = [], [], []
    common = {"gate_threshold": options.gate_threshold, "d": options.d}
    for name, dense in candidates:
        kind = "embedding" if isinstance(dense, nn.Embedding) else "linear"
        size = dense.weight.numel()
        alias = aliases.get(name)
        if not (options.selects(name) or (alias is not None and options.selects(alias))):
            skipped.append(
                SkippedLayer(name, kind, f"not selected by layers={list(options.layers)}")
            )
            continue
        if size < options.min_size:
            skipped.append(
                SkippedLayer(
                    name, kind, f"dense weight has {size} < min_size={options.min_size} entries"
                )
            )
            continue
        try:
            layer = _convert(dense, options, common, from_weights)
        except ValueError as err:
            raise ValueError(f"cannot tensorize {name!r}: {err}") from err
        if from_weights:
            if isinstance(layer, TTLinear):
                balance_cores_(layer)  # same product; even core norms for one Adam lr
            rows.append(layer_row(name, layer, dense.weight.detach()))
        parent, _, attr = name.rpartition(".")
        setattr(root.get_submodule(parent) if parent else root, attr, layer)
        done.append(name)
    return TensorizeReport(tuple(done), tuple(skipped)), rows


def tensorize_encoder_(
    model: BertEncoder,
    options: TensorizeOptions,
    *,
    embeddings: bool,
    from_weights: bool = True,
) -> TensorizeReport:
    """Replace the selected layers by TT / TTM ones in place (:func:`swap_to_tt_`); attach
    the report and the per-layer rows (``model.conversion``) and return the report."""
    found = _candidates(model, embeddings)
    report, rows = swap_to_tt_(
        model,
        found,
        options,
        where="the BERT encoder",
        from_weights=from_weights,
        aliases={n: a for n, _ in found if (a := legacy_name(n)) is not None},
    )
    model.tensorize_report = report
    model.conversion = rows
    return report


def _convert(
    dense: nn.Module, options: TensorizeOptions, common: dict[str, Any], from_weights: bool
) -> nn.Module:
    if isinstance(dense, nn.Embedding):
        rank = options.embedding_rank
        if from_weights:
            return TTMEmbedding.from_embedding(dense, max_rank=rank, **common)
        return TTMEmbedding(
            dense.num_embeddings,
            dense.embedding_dim,
            max_rank=rank,
            padding_idx=dense.padding_idx,
            **common,
        )
    assert isinstance(dense, nn.Linear)
    if from_weights:
        return TTLinear.from_linear(dense, max_rank=options.max_rank, **common)
    return TTLinear(
        dense.in_features,
        dense.out_features,
        dense.bias is not None,
        max_rank=options.max_rank,
        **common,
    )


def _student_of(teacher: BertEncoder, config: HFBertConfig) -> SentenceEncoder:
    """A copy of ``teacher``'s weights and buffers under the student's settings (dropout).

    Built on the meta device and then filled, so no random start is drawn for weights that
    are overwritten at once (a third of a pretrained build's time for MiniLM). Nothing is
    shared with the teacher."""
    with on_meta():
        model = SentenceEncoder(config.arch, config)
    model.to_empty(device="cpu")
    model.load_state_dict(teacher.state_dict(), strict=True)
    with torch.no_grad():  # the buffers state_dict leaves out (position and token-type ids)
        for name, buffer in teacher.named_buffers():
            model.get_buffer(name).copy_(buffer)
    return model


def build_hf_bert(
    config: HFBertConfig, *, tensorized: bool, options: TensorizeOptions
) -> SentenceEncoder:
    """The student (dense or TT-SVD-converted) with the frozen original as its teacher.

    With ``config.path``: the weights of the directory; without: the bare architecture of
    ``config.architecture`` (random weights, fresh TT layers), to load a checkpoint into.
    """
    directory = config.model_dir
    if directory is None:
        model = SentenceEncoder(config.arch, config)
    else:
        teacher = load_pretrained(directory, config.arch)
        model = _student_of(teacher, config)
        model.set_teacher(teacher)
    if not config.train_embeddings:
        model.embeddings.requires_grad_(False)  # word, position, token-type tables, LayerNorm
    if not tensorized:
        model.tensorize_report = TensorizeReport()
        model.conversion = []
        return model
    tensorize_encoder_(
        model, options, embeddings=config.tensorize_embeddings, from_weights=directory is not None
    )
    return model
