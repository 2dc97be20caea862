"""The data-aware starts of a pretrained ``hf`` student (``init: "whitened"``, ``"sequential"``).

Before the first step, on ``calibration_sentences`` sentences of the training split, the
frozen original runs with forward hooks on every module the swap replaced; each collects the
Gram matrix ``C = X^T X`` of that module's input rows over attended tokens (float64). Each TT
layer is then rebuilt, with the same modes and ranks, from the whitened truncation of the
original's dense weight: the rank-``r`` matrix with the smallest error on the layer's outputs
for those inputs (:func:`engine.models.hf_bert.whiten.whitened_weight`), ``r`` the layer's
middle bond. Plain TT-SVD minimizes the weight error instead. ``Conv1D`` weights are taken in
the ``nn.Linear`` layout, as the swap takes them. A resumed run restores its weights instead.

``init: "sequential"`` (a pretrained BERT sentence encoder, the ``hf_bert`` recipe's start):
the TT linears of the encoder layers are refitted block by block, each to the original's
outputs on the already compressed student's own inputs, at the ranks they were built with
(:func:`engine.models.hf_bert.calib.fit_sequential_`, residual targets; the calibration
sentences regrouped by length). Other TT layers keep their TT-SVD.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from engine.configs import ConfigError
from engine.models.hf.model import HFModel
from engine.models.hf.swap import as_linear
from engine.models.hf_bert.batches import by_length, take_sentences
from engine.models.hf_bert.calib import ANCHOR_SEQUENTIAL, RIDGE_SEQUENTIAL, fit_sequential_
from engine.models.hf_bert.convert import layer_row
from engine.models.hf_bert.whiten import (
    _output_error,
    input_gram,
    rebuild_tt,
    whitened_weight,
)
from engine.nn.tt_linear import TTLinear

__all__ = ["prepare_hf_"]


@torch.no_grad()
def prepare_hf_(
    model: HFModel, batches: Iterable[Mapping[str, Tensor]], *, device: torch.device
) -> dict[str, Any] | None:
    """Refit the TT layers from the whitened truncation (module docstring); ``None`` when
    there is nothing to do (``init: "tt_svd"``, no teacher, no TT layer)."""
    cfg, teacher = model.config, model.teacher
    layers = {n: m for n, m in model.net.named_modules() if isinstance(m, TTLinear)}
    if cfg.init == "tt_svd" or teacher is None or not layers:
        return None
    if cfg.init == "sequential":
        return _sequential_(model, layers, batches, device)
    grams, seen = input_gram(
        teacher,
        list(layers),
        batches,
        sentences=cfg.calibration_sentences,
        device=device,
        forward=lambda ids, mask, types: model.call(teacher, ids, mask, types),
    )
    if seen == 0:
        raise ConfigError("data", "the training split has no sentences to calibrate on")
    rows = []
    for name, old in layers.items():
        dense = as_linear(teacher.get_submodule(name)).weight.detach()  # (out, in)
        gram = grams[name]
        target = whitened_weight(dense, gram, old.ranks[len(old.in_modes)])  # (out, in)
        new = rebuild_tt(old, target, old.bias).to(device)
        before = _output_error(dense, old.to_dense(), gram)
        after = _output_error(dense, new.to_dense(), gram)
        parent, _, attr = name.rpartition(".")
        setattr(model.net.get_submodule(parent) if parent else model.net, attr, new)
        rows.append({"name": name, "output_error_tt_svd": before, "output_error_whitened": after})
    return _record(model, layers, "whitened", seen, rows)


def _sequential_(
    model: HFModel,
    layers: Mapping[str, TTLinear],
    batches: Iterable[Mapping[str, Tensor]],
    device: torch.device,
) -> dict[str, Any]:
    """``init: "sequential"`` (module docstring) on ``model.net``, a transformers BertModel."""
    teacher = model.teacher
    assert teacher is not None
    calib, _ = take_sentences(batches, model.config.calibration_sentences, 0, device)
    seen = sum(int(ids.shape[0]) for ids, _, _ in calib)
    if seen == 0:
        raise ConfigError("data", "the training split has no sentences to calibrate on")
    ranks = {n: int(max(m.ranks)) for n, m in layers.items()}  # compression.max_rank, as built
    rows = fit_sequential_(
        model.net,
        teacher,
        by_length(calib),
        ranks,
        ridge=RIDGE_SEQUENTIAL,
        residual=True,
        anchor=ANCHOR_SEQUENTIAL,
    )
    return _record(model, layers, "sequential", seen, rows)


def _record(
    model: HFModel, layers: Iterable[str], init: str, seen: int, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The start's conversion report (each layer against the teacher's dense weight) and its
    ``preparation`` info, set on ``model``; the info returned."""
    teacher = model.teacher
    assert teacher is not None
    model.conversion = [
        layer_row(n, model.net.get_submodule(n), as_linear(teacher.get_submodule(n)).weight)
        for n in layers
    ]
    info = {"init": init, "calibration_sentences": seen, "layers": rows}
    model.preparation = info
    return info
