"""The generic swap: a transformers model's linear layers (and, on request, its output
projection and input embedding) replaced in place by TT / TTM layers.

Candidates come from the family table (:mod:`engine.models.hf.families`) or the job's
``targets``; ``compression.layers`` patterns and ``compression.min_size`` then select among
them as for every workload. A candidate that is neither ``nn.Linear`` nor GPT-2's ``Conv1D``
(nor ``nn.Embedding`` for the embedding) is a config error naming the module: a typo or an
unsupported layer never leaves a model silently dense. ``Conv1D`` holds ``W`` as ``(in, out)``;
its TT layer is the TT-SVD of ``W^T``, the ``nn.Linear`` layout, so the swap is exact up to
the truncation.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from engine.configs import ConfigError
from engine.models.hf.config import HFConfig
from engine.models.hf.families import family_of
from engine.models.hf_bert.convert import swap_to_tt_
from engine.models.tensorize import TensorizeOptions, TensorizeReport

__all__ = ["candidates", "tensorize_hf_", "as_linear"]


def _is_conv1d(module: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, Conv1D)


def as_linear(module: nn.Module) -> nn.Linear:
    """``module`` as an ``nn.Linear`` sharing nothing: itself, or a transposed ``Conv1D``."""
    if isinstance(module, nn.Linear):
        return module
    w = module.weight.detach()  # (in, out)
    lin = nn.Linear(w.shape[0], w.shape[1], bias=module.bias is not None, device="meta")
    lin.weight = nn.Parameter(w.t().contiguous())  # (out, in)
    if module.bias is not None:
        lin.bias = nn.Parameter(module.bias.detach().clone())
    return lin


def candidates(net: nn.Module, config: HFConfig) -> list[tuple[str, nn.Module]]:
    """The modules the job may tensorize, in module order, each of a supported type."""
    family = family_of(config.config_json["model_type"])
    suffixes = config.targets if config.targets is not None else family.linears
    heads = set(family.lm_heads) if config.tensorize_lm_head else set()
    embedding = None
    if config.tensorize_embeddings:
        emb = net.get_input_embeddings()
        embedding = next(n for n, m in net.named_modules() if m is emb)
    found: list[tuple[str, nn.Module]] = []
    for name, module in net.named_modules():
        is_target = any(name == s or name.endswith("." + s) for s in suffixes)
        if name == embedding:
            if not isinstance(module, nn.Embedding):
                raise ConfigError(
                    "model.config.tensorize_embeddings", f"{name!r} is a {type(module).__name__}"
                )
            found.append((name, module))
        elif is_target or name in heads:
            if not (isinstance(module, nn.Linear) or _is_conv1d(module)):
                raise ConfigError(
                    "model.config.targets",
                    f"module {name!r} is a {type(module).__name__}; only nn.Linear and "
                    "Conv1D layers can be tensorized",
                )
            found.append((name, module))
    if config.targets is not None:
        for suffix in config.targets:
            if not any(n == suffix or n.endswith("." + suffix) for n, _ in found):
                raise ConfigError(
                    "model.config.targets", f"{suffix!r} names no module of the model"
                )
    return found


def tensorize_hf_(
    net: nn.Module, config: HFConfig, options: TensorizeOptions, *, from_weights: bool
) -> tuple[TensorizeReport, list[dict[str, Any]], dict[str, str]]:
    """Swap the selected candidates of ``net`` in place
    (:func:`engine.models.hf_bert.convert.swap_to_tt_`, with each ``Conv1D`` in the
    ``nn.Linear`` layout); the report, per-layer rows and the original type of every swapped
    module (``linear``, ``conv1d`` or ``embedding``)."""
    found = candidates(net, config)
    report, rows = swap_to_tt_(
        net,
        [(n, m if isinstance(m, nn.Embedding) else as_linear(m)) for n, m in found],
        options,
        where=f"the {type(net).__name__} model",
        from_weights=from_weights,
    )
    original = dict(found)
    return report, rows, {n: _kind(original[n]) for n in report.tensorized}


def _kind(module: nn.Module) -> str:
    if isinstance(module, nn.Embedding):
        return "embedding"
    return "conv1d" if _is_conv1d(module) else "linear"
