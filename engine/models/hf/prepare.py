"""The activation-aware start of a pretrained ``hf`` student (``init: "whitened"``).

Before the first step, on ``calibration_sentences`` sentences of the training split, the
frozen original runs with forward hooks on every module the swap replaced; each collects the
Gram matrix ``C = X^T X`` of that module's input rows over attended tokens (float64). Each TT
layer is then rebuilt, with the same modes and ranks, from the whitened truncation of the
original's dense weight: the rank-``r`` matrix with the smallest error on the layer's outputs
for those inputs (:func:`engine.models.hf_bert.whiten.whitened_weight`), ``r`` the layer's
middle bond. Plain TT-SVD minimizes the weight error instead. ``Conv1D`` weights are taken in
the ``nn.Linear`` layout, as the swap takes them. A resumed run restores its weights instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from engine.configs import ConfigError
from engine.models.hf.model import HFModel
from engine.models.hf.swap import as_linear
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
    if cfg.init != "whitened" or teacher is None or not layers:
        return None
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
    model.conversion = [
        layer_row(n, model.net.get_submodule(n), as_linear(teacher.get_submodule(n)).weight)
        for n in layers
    ]
    info = {"init": "whitened", "calibration_sentences": seen, "layers": rows}
    model.preparation = info
    return info
