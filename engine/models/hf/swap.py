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
from engine.models.hf_bert.convert import layer_row
from engine.models.hf_bert.whiten import balance_cores_
from engine.models.tensorize import TensorizeOptions, TensorizeReport, require_matches
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.summary import SkippedLayer

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


def _convert(
    module: nn.Module, options: TensorizeOptions, common: dict[str, Any], from_weights: bool
) -> nn.Module:
    if isinstance(module, nn.Embedding):
        if from_weights:
            return TTMEmbedding.from_embedding(module, max_rank=options.embedding_rank, **common)
        return TTMEmbedding(
            module.num_embeddings,
            module.embedding_dim,
            max_rank=options.embedding_rank,
            padding_idx=module.padding_idx,
            **common,
        )
    lin = as_linear(module)
    if from_weights:
        return TTLinear.from_linear(lin, max_rank=options.max_rank, **common)
    return TTLinear(
        lin.in_features, lin.out_features, lin.bias is not None, max_rank=options.max_rank, **common
    )


def tensorize_hf_(
    net: nn.Module, config: HFConfig, options: TensorizeOptions, *, from_weights: bool
) -> tuple[TensorizeReport, list[dict[str, Any]], dict[str, str]]:
    """Swap the selected candidates of ``net`` in place; the report, per-layer rows and the
    original type of every swapped module (``linear``, ``conv1d`` or ``embedding``).

    ``from_weights``: TT-SVD of the current weights (rows: modes, ranks, sizes, relative
    error); otherwise fresh layers of the same shapes (trained from scratch, or about to
    receive a checkpoint's weights).
    """
    found = candidates(net, config)
    require_matches(options.layers, [n for n, _ in found], f"the {type(net).__name__} model")
    common = {"gate_threshold": options.gate_threshold, "d": options.d}
    done, skipped, rows = [], [], []
    kinds: dict[str, str] = {}
    for name, module in found:
        kind = "embedding" if isinstance(module, nn.Embedding) else "linear"
        size = module.weight.numel()
        if not options.selects(name):
            skipped.append(
                SkippedLayer(name, kind, f"not selected by layers={list(options.layers)}")
            )
            continue
        if size < options.min_size:
            reason = f"dense weight has {size} < min_size={options.min_size} entries"
            skipped.append(SkippedLayer(name, kind, reason))
            continue
        try:
            layer = _convert(module, options, common, from_weights)
        except ValueError as err:
            raise ValueError(f"cannot tensorize {name!r}: {err}") from err
        if from_weights:
            dense = module.weight.detach()
            if isinstance(layer, TTLinear):
                balance_cores_(layer)  # same product; even core norms for one Adam lr
                dense = as_linear(module).weight.detach()  # (out, in)
            rows.append(layer_row(name, layer, dense))
        parent, _, attr = name.rpartition(".")
        setattr(net.get_submodule(parent) if parent else net, attr, layer)
        done.append(name)
        kinds[name] = "conv1d" if _is_conv1d(module) else kind
    return TensorizeReport(tuple(done), tuple(skipped)), rows, kinds
