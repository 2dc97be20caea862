"""Parameter groups by a stated rule, the optimizer of each method, and ``get_lr``.

The rule (docs/method.md#training-defaults; the authors' code groups the classifier
differently, we do not):

* ``cores``: every TT / TTM core (``TTLinear.cores``, ``TTMEmbedding.cores``); for ``dense``
  and ``galore`` jobs, the weights of the layers CoMERA would tensorize (same learning rate
  for the layer in either form, so the methods compare on equal footing);
* ``gates``: every rank-gate vector;
* ``others``: everything else (biases, LayerNorms, dense layers, position embeddings).

``comera`` and ``dense`` use AdamW (weight decay from the job, default 0); ``galore`` uses
galore-torch's ``GaLoreAdamW`` with the ``nn.Linear`` weights of the ``cores`` group projected
(rank, gap, scale from the job), as the GaLore paper does for attention and MLP weights;
embedding tables stay plain Adam.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.models.registry import TensorizeOptions
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.train.config import GaloreConfig, LearningRates, StageConfig

__all__ = ["GROUPS", "group_parameters", "build_optimizer", "get_lr", "set_stage_lrs"]

GROUPS = ("cores", "gates", "others")


def group_parameters(
    model: nn.Module, options: TensorizeOptions | None = None
) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """``{"cores": [(name, p)], "gates": [...], "others": [...]}`` by the rule above.

    ``options`` selects which dense ``nn.Linear`` / ``nn.Embedding`` weights count as
    ``cores`` in an untensorized model (``None``: none do).
    """
    kind_of: dict[int, str] = {}
    for mod_name, mod in model.named_modules():
        if isinstance(mod, TTLinear | TTMEmbedding):
            kind_of.update({id(p): "cores" for p in mod.cores})
            kind_of.update({id(p): "gates" for p in mod.gates})
        elif (
            options is not None
            and isinstance(mod, nn.Linear | nn.Embedding)
            and options.selects(mod_name)
        ):
            kind_of.setdefault(id(mod.weight), "cores")
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {g: [] for g in GROUPS}
    for name, p in model.named_parameters():  # shared parameters are listed once
        groups[kind_of.get(id(p), "others")].append((name, p))
    return groups


def build_optimizer(
    model: nn.Module,
    method: str,
    lr: LearningRates,
    *,
    options: TensorizeOptions,
    weight_decay: float = 0.0,
    galore: GaloreConfig | None = None,
) -> torch.optim.Optimizer:
    """The job's optimizer; each param group carries ``name`` (one of :data:`GROUPS`)."""
    groups = group_parameters(model, options if method != "comera" else None)
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    param_groups = []
    for name in GROUPS:
        members = [p for _, p in groups[name]]
        if not members:
            continue
        group = {
            "params": members,
            "lr": getattr(lr, name),
            "name": name,
            "weight_decay": weight_decay,
        }
        if method == "galore" and name == "cores":
            two_d = [p for p in members if id(p) in linear_weights]
            rest = [p for p in members if id(p) not in linear_weights]
            if rest:
                param_groups.append({**group, "params": rest})
            g = galore or GaloreConfig()
            group = {
                **group,
                "params": two_d,
                "rank": g.rank,
                "update_proj_gap": g.update_proj_gap,
                "scale": g.scale,
                "proj_type": g.proj_type,
            }
        param_groups.append(group)
    if method == "galore":
        from galore_torch import GaLoreAdamW

        return GaLoreAdamW(
            param_groups, lr=lr.cores, weight_decay=weight_decay, no_deprecation_warning=True
        )
    return torch.optim.AdamW(param_groups, lr=lr.cores, weight_decay=weight_decay, foreach=True)


def get_lr(base: float, step: int, stage: StageConfig, total_steps: int) -> float:
    """Pure schedule: linear warm-up over ``warmup_steps``, then constant or cosine to 0."""
    if stage.warmup_steps and step < stage.warmup_steps:
        return base * (step + 1) / stage.warmup_steps
    if stage.lr_schedule == "constant":
        return base
    span = max(total_steps - stage.warmup_steps, 1)
    progress = min(max(step - stage.warmup_steps, 0) / span, 1.0)
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_stage_lrs(
    optimizer: torch.optim.Optimizer,
    stage: StageConfig,
    step: int,
    total_steps: int,
    scale: float = 1.0,
) -> None:
    """Learning rate of every group for ``step`` of ``stage`` (gates frozen in finetune), times
    ``scale`` (the fidelity guard's, after a back-off: :mod:`engine.train.guard`).

    A tensor learning rate (a capturable optimizer replayed in a CUDA graph) is set in place.
    """
    for group in optimizer.param_groups:
        base = getattr(stage.lr, group["name"])
        if stage.kind == "finetune" and group["name"] == "gates":
            base = 0.0
        lr = get_lr(base, step, stage, total_steps) * scale
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
