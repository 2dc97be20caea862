"""The data-aware starts of a pretrained ``hf`` student (``init: "whitened"``, ``"sequential"``).

Before the first step, on ``calibration_sentences`` sentences of the training split, the
frozen original runs with forward hooks on every module the swap replaced; each collects the
Gram matrix ``C = X^T X`` of that module's input rows over attended tokens (float64). Each TT
layer is then rebuilt, with the same modes and ranks, from the whitened truncation of the
original's dense weight: the rank-``r`` matrix with the smallest error on the layer's outputs
for those inputs (:func:`engine.models.hf_bert.whiten.whitened_weight`), ``r`` the layer's
middle bond. Plain TT-SVD minimizes the weight error instead. ``Conv1D`` weights are taken in
the ``nn.Linear`` layout, as the swap takes them. A resumed run restores its weights instead.

``rank_allocation: "energy"``: the same budget of TT entries as the uniform build (every layer
at ``compression.max_rank``), spread by :func:`engine.models.hf_bert.ranks.allocate_ranks`
over the layers' whitened spectra (``e_i``: squared singular values of ``S W^T``, the energy
each truncation leaves out, relative to the layer's total): a layer whose outputs need more
rank gets it from one that needs less. Each layer is rebuilt at its allocated rank (every bond
capped there) from the whitened truncation at that rank, or, with ``init: "sequential"``, from
the TT-SVD at that rank, which the sequential fit then refits.

``target_compression`` replaces that budget by the dense entries of the TT layers over it
(a compression factor). Neither allocation caps a layer at ``compression.max_rank``: the
budget does.

``rank_allocation: "sensitivity"`` (a BERT sentence encoder): the same budget, spread by
:func:`engine.models.hf_bert.ranks.plan_ranks`: each layer's spectrum on the teacher's own
stage inputs, weighted by the cosine its whitened fit alone costs the pooled embedding on
``probe_sentences`` training sentences that follow the calibration ones, times
``depth_gain ** block``. It is the ``hf_bert`` recipe's allocation, on the same sentences the
same ranks.

``init: "sequential"`` (a pretrained BERT sentence encoder, the ``hf_bert`` recipe's start):
the TT linears of the encoder layers are refitted block by block, each to the original's
outputs on the already compressed student's own inputs, at the ranks they were built with
(:func:`engine.models.hf_bert.calib.fit_sequential_`, residual targets; the calibration
sentences regrouped by length). Other TT layers keep their TT-SVD.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from engine.configs import ConfigError
from engine.models.hf.model import HFModel
from engine.models.hf.swap import as_linear
from engine.models.hf_bert.batches import Batch, as_dicts, by_length, take_sentences
from engine.models.hf_bert.calib import ANCHOR_SEQUENTIAL, RIDGE_SEQUENTIAL, fit_sequential_
from engine.models.hf_bert.convert import layer_row
from engine.models.hf_bert.ranks import (
    LayerProfile,
    allocate_ranks,
    plan_ranks,
    probe_batches,
    profile_first,
    tt_params_at_rank,
)
from engine.models.hf_bert.whiten import (
    _output_error,
    input_gram,
    rebuild_tt,
    replace_module_,
    whitened_spectrum,
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
    t0 = time.perf_counter()
    info = _start_(model, layers, batches, device)
    info["seconds"] = round(time.perf_counter() - t0, 3)
    return info


def _start_(
    model: HFModel,
    layers: Mapping[str, TTLinear],
    batches: Iterable[Mapping[str, Tensor]],
    device: torch.device,
) -> dict[str, Any]:
    """:func:`prepare_hf_` once it knows there is something to do."""
    cfg, teacher = model.config, model.teacher
    assert teacher is not None
    if cfg.init == "sequential" and cfg.rank_allocation == "uniform":
        return _sequential_(model, layers, batches, device)
    calib: list[Batch] = []
    probes: list[Batch] = []
    if cfg.rank_allocation == "sensitivity":  # the calibration sentences, then the probes
        calib, probes = take_sentences(
            batches, cfg.calibration_sentences, cfg.probe_sentences, device
        )
        batches = as_dicts(calib)
    elif cfg.init == "sequential":  # read twice: for the spectra, then by the fit
        batches = _first(batches, cfg.calibration_sentences)
    dense = {n: as_linear(teacher.get_submodule(n)).weight.detach() for n in layers}  # (out, in)
    built = {n: m.ranks[len(m.in_modes)] for n, m in layers.items()}  # the middle bond
    grams, seen = {}, 0
    if cfg.init == "whitened" or cfg.rank_allocation == "energy":
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
    ranks, alloc = built, None
    budget = _budget(cfg.target_compression, layers, built)
    if cfg.rank_allocation == "energy":
        spectra = {n: whitened_spectrum(dense[n], grams[n]) for n in layers}  # (q,) each
        ranks, alloc = _allocate(layers, spectra, budget)
    elif cfg.rank_allocation == "sensitivity":
        ranks, alloc = _sensitivity(model, layers, calib, probes, budget, device)
    if cfg.init == "sequential":  # at the allocated ranks, when allocated
        if alloc is not None:
            for name, old in layers.items():
                new = rebuild_tt(old, dense[name], old.bias, max_rank=ranks[name]).to(device)
                replace_module_(model.net, name, new)
        tt = {n: m for n, m in model.net.named_modules() if isinstance(m, TTLinear)}
        info = _sequential_(model, tt, batches, device)
        if alloc is not None:
            info["allocation"] = alloc
        return info
    rows = []
    for name, old in layers.items():
        target = whitened_weight(dense[name], grams[name], ranks[name])  # (out, in)
        cap = None if alloc is None else ranks[name]
        new = rebuild_tt(old, target, old.bias, max_rank=cap).to(device)
        before = _output_error(dense[name], old.to_dense(), grams[name])
        after = _output_error(dense[name], new.to_dense(), grams[name])
        replace_module_(model.net, name, new)
        rows.append(
            {"name": name, "output_error_tt_svd": before, "output_error_whitened": after}
            | ({} if alloc is None else {"rank": ranks[name], "built_rank": built[name]})
        )
    info = _record(model, layers, "whitened", seen, rows)
    if alloc is not None:
        info["allocation"] = alloc
    return info


def _budget(
    target: float | None, layers: Mapping[str, TTLinear], built: Mapping[str, int]
) -> float:
    """The allocation's TT entries: the dense entries over ``target_compression``, or (no
    target) the uniform build's, every layer at its built rank."""
    if target is not None:
        return sum(m.dense_parameters() for m in layers.values()) / target
    return float(sum(tt_params_at_rank(layers[n], r) for n, r in built.items()))


def _sensitivity(
    model: HFModel,
    layers: Mapping[str, TTLinear],
    calib: list[Batch],
    probes: list[Batch],
    budget: float,
    device: torch.device,
) -> tuple[dict[str, int], dict[str, Any]]:
    """``rank_allocation: "sensitivity"`` (module docstring): the ranks by the probed
    sentence-embedding cost of each layer's error, as ``hf_bert``'s
    (:mod:`engine.models.hf_bert.prepare`, :mod:`engine.models.hf_bert.ranks`)."""
    cfg, teacher = model.config, model.teacher
    assert teacher is not None
    if not calib:
        raise ConfigError("data", "the training split has no sentences to calibrate on")
    calib = profile_first(calib, device)
    probing, from_calibration = probe_batches(probes, calib, cfg.probe_sentences, device)
    ranks, info = plan_ranks(
        model.net,
        teacher,
        calib,
        probing,
        mode="sensitivity",
        budget=budget,
        caps={n: min(m.in_features, m.out_features) for n, m in layers.items()},
        depth_gain=cfg.depth_gain,
    )
    if from_calibration:
        info["probes_from"] = "calibration"  # the training split had no more sentences
    return ranks, info


def _first(batches: Iterable[Mapping[str, Tensor]], sentences: int) -> list[Mapping[str, Tensor]]:
    """The leading batches that hold ``sentences`` sentences (the last one may hold more)."""
    out, seen = [], 0
    for batch in batches:
        if seen >= sentences:
            break
        out.append(batch)
        seen += int(batch["input_ids"].shape[0])
    return out


def _allocate(
    layers: Mapping[str, TTLinear], spectra: Mapping[str, Tensor], budget: float
) -> tuple[dict[str, int], dict[str, Any]]:
    """``rank_allocation: "energy"`` (module docstring): the rank of each layer within
    ``budget`` TT entries (up to the layer's full rank), and what the allocation saw."""
    profiles = []
    built = {n: m.ranks[len(m.in_modes)] for n, m in layers.items()}
    for name, layer in layers.items():
        energy = spectra[name].double() ** 2  # (q,) descending
        costs = tuple(tt_params_at_rank(layer, r) for r in range(energy.numel() + 1))
        profiles.append(LayerProfile(name, energy, costs))
    ranks = allocate_ranks(profiles, budget)
    left = sum(p.left_out(ranks[p.name]) for p in profiles)
    uniform = sum(p.left_out(built[p.name]) for p in profiles)
    return ranks, {
        "rank_allocation": "energy",
        "budget": int(budget),
        "tt_params": sum(p.costs[ranks[p.name]] for p in profiles),
        "energy_left_out": left,  # summed over the layers: the allocation's objective
        "energy_left_out_uniform": uniform,
    }


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
    ranks = {n: int(max(m.ranks)) for n, m in model.net.named_modules() if isinstance(m, TTLinear)}
    info = {"init": init, "calibration_sentences": seen, "ranks": ranks, "layers": rows}
    model.preparation = info
    return info
