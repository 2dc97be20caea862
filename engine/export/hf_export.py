"""``model/hf/`` and ``model/dense/``: a compressed ``hf`` model as Hugging Face directories.

* :func:`export_hf`: ``config.json`` (the original's, plus ``comera_tt``: every swapped
  module's sizes, modes and ranks, and ``auto_map`` naming the class below), the weights in
  ``model.safetensors`` (TT cores at their final ranks, gates folded in, written by
  transformers' own ``save_pretrained``), ``modeling_comera_tt.py`` (the plain-torch
  :mod:`engine.export.hf_modeling` plus a subclass of the original's transformers class that
  swaps in the TT layers) and the tokenizer. ``AutoModelFor<Task>.from_pretrained(dir,
  trust_remote_code=True)`` loads it where this project is not installed.
* :func:`export_dense`: every TT layer multiplied out into the original module type
  (``nn.Linear`` or ``Conv1D``): the standard architecture, loadable without remote code.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.export import hf_modeling
from engine.export.hf_modeling import CompactTTLinear
from engine.models.hf.families import TASKS
from engine.models.hf.model import HFModel
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding

__all__ = ["export_hf", "export_dense", "densified_net", "MODELING_FILE", "CLASS_NAME"]

MODELING_FILE = "modeling_comera_tt.py"
CLASS_NAME = "ComeraTTModel"
FORMAT_VERSION = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _modeling_source(base: str) -> str:
    """This package's plain-torch TT layer, then the class ``auto_map`` names."""
    text = Path(hf_modeling.__file__).read_text(encoding="utf-8")
    return text + (
        "\n\nimport transformers as _transformers  # noqa: E402\n\n\n"
        f"class {CLASS_NAME}(_transformers.{base}):\n"
        f'    """``{base}`` with the TT layers of ``config.comera_tt`` swapped in."""\n\n'
        "    def __init__(self, config, *args, **kwargs):\n"
        "        super().__init__(config, *args, **kwargs)\n"
        '        swap_tt_layers(self, config.comera_tt["layers"])\n'
    )


def _compact(layer: TTLinear) -> tuple[CompactTTLinear, dict[str, Any]]:
    """A gate-free copy of ``layer`` at its live ranks, and its ``comera_tt`` record."""
    layer = copy.deepcopy(layer).float()
    layer.shrink_()  # bonds sliced to the live gate entries
    layer.fold_gates_()  # mu(g) into the cores, gates 1
    rec = {
        "in_features": layer.in_features,
        "out_features": layer.out_features,
        "in_modes": list(layer.in_modes),
        "out_modes": list(layer.out_modes),
        "ranks": list(layer.ranks),
        "bias": layer.bias is not None,
    }
    out = CompactTTLinear(**rec)
    with torch.no_grad():
        for dst, src in zip(out.cores, layer.cores, strict=True):
            dst.copy_(src.detach())
        if layer.bias is not None:
            out.bias.copy_(layer.bias.detach())
    return out, rec


def _set(net: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(net.get_submodule(parent) if parent else net, attr, module)


def _write_tokenizer(tokenizer: Path | None, directory: Path) -> None:
    if tokenizer is None:
        return
    shutil.copy(tokenizer, directory / "tokenizer.json")
    for name in TOKENIZER_FILES[1:]:
        src = tokenizer.parent / name
        if src.is_file():
            shutil.copy(src, directory / name)


def export_hf(model: HFModel, directory: Path, *, tokenizer: Path | None) -> dict[str, Any]:
    """Write ``directory`` (see the module docstring); what was written."""
    if any(isinstance(m, TTMEmbedding) for m in model.net.modules()):
        raise ValueError("a TTM embedding has no plain-torch export yet (tensorize_embeddings)")
    net = copy.deepcopy(model.net).float().cpu()
    layers = {}
    for name, module in list(net.named_modules()):
        if isinstance(module, TTLinear):
            compact, layers[name] = _compact(module)
            _set(net, name, compact)
    config = net.config
    config.comera_tt = {"format": FORMAT_VERSION, "layers": layers}
    config.auto_map = {TASKS[model.config.task]: f"{MODELING_FILE[:-3]}.{CLASS_NAME}"}
    if any(name in model.family.lm_heads for name in layers):
        config.tie_word_embeddings = False  # the head is TT now: nothing to tie
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(directory)
    base = type(model.net).__name__
    (directory / MODELING_FILE).write_text(_modeling_source(base), encoding="utf-8")
    _write_tokenizer(tokenizer, directory)
    return {"path": str(directory), "class": base, "tt_layers": len(layers)}


def densified_net(model: HFModel) -> nn.Module:
    """A copy of ``model.net`` with every TT / TTM layer multiplied out into the module type
    it replaced: the standard transformers architecture."""
    from transformers.pytorch_utils import Conv1D

    net = copy.deepcopy(model.net).float().cpu()
    for name, module in list(net.named_modules()):
        if isinstance(module, TTLinear):
            with torch.no_grad():
                w = module.to_dense()  # (out, in)
                if model.swapped.get(name) == "conv1d":
                    dense = Conv1D(module.out_features, module.in_features)
                    dense.weight.copy_(w.t())  # (in, out)
                else:
                    has_bias = module.bias is not None
                    dense = nn.Linear(module.in_features, module.out_features, bias=has_bias)
                    dense.weight.copy_(w)
                if module.bias is not None:
                    dense.bias.copy_(module.bias.detach())
            _set(net, name, dense)
        elif isinstance(module, TTMEmbedding):
            with torch.no_grad():
                table = module.to_dense()  # (V, D)
            dense = nn.Embedding(*table.shape, padding_idx=module.padding_idx)
            with torch.no_grad():
                dense.weight.copy_(table)
            _set(net, name, dense)
    return net


def export_dense(model: HFModel, directory: Path, *, tokenizer: Path | None) -> dict[str, Any]:
    """Write the densified standard architecture to ``directory``; what was written."""
    net = densified_net(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(directory)
    _write_tokenizer(tokenizer, directory)
    (directory / "comera_dense.json").write_text(
        json.dumps({"densified": sorted(model.swapped)}, indent=2) + "\n", encoding="utf-8"
    )
    return {"path": str(directory), "class": type(model.net).__name__}
