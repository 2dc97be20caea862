"""Before the first step of an ``hf_bert`` job: choose the ranks and refit the TT linears.

:func:`prepare_student_` runs once on a freshly built student (the trainer calls it through
the workload's ``prepare``; a resumed job restores its weights instead). Unless
``init="tt_svd"`` it takes the first ``calibration_sentences`` sentences of the training
split (and, for ``rank_allocation="sensitivity"``, the ``probe_sentences`` that follow), then

1. with a budgeted ``rank_allocation``: the ranks from
   :func:`engine.models.hf_bert.ranks.plan_ranks` within ``dense entries /
   target_compression`` (capped by the built ranks, i.e. ``compression.max_rank``); with
   ``uniform``: the built ranks;
2. refits every TT linear at its rank: ``sequential`` by
   :func:`engine.models.hf_bert.calib.fit_sequential_` (residual targets; teacher rows
   anchored with weight ``ANCHOR_SEQUENTIAL``, 0), ``whitened`` by
   :func:`engine.models.hf_bert.whiten.whiten_tt_linears_` (after a TT-SVD at the new ranks).

The calibration rows are regrouped by length (padding stripped, at most
:data:`engine.models.hf_bert.batches.CALIBRATION_BATCH` sentences a batch) so no time goes
to padded positions; the sums do not depend on the grouping. What was done is returned and
kept as ``model.preparation`` (sentences used, ranks, per-layer fit errors, allocation
details, seconds), and ``model.conversion`` is refreshed for the new layers.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from engine.configs import ConfigError
from engine.models.hf_bert.batches import Batch, as_dicts, take_sentences
from engine.models.hf_bert.calib import ANCHOR_SEQUENTIAL, RIDGE_SEQUENTIAL, fit_sequential_
from engine.models.hf_bert.convert import layer_row
from engine.models.hf_bert.model import SentenceEncoder
from engine.models.hf_bert.ranks import plan_ranks, probe_batches, profile_first
from engine.models.hf_bert.whiten import input_gram, replace_module_, whiten_tt_linears_
from engine.nn.tt_linear import TTLinear

__all__ = ["prepare_student_"]


def prepare_student_(
    model: SentenceEncoder, batches: Iterable[Mapping[str, Tensor]], *, device: torch.device
) -> dict[str, Any] | None:
    """Choose the ranks and refit the TT linears (module docstring); ``None`` when there is
    nothing to do (``init="tt_svd"``, no teacher, no TT linear)."""
    teacher, cfg = model.teacher, model.config
    layers = {n: m for n, m in model.named_modules() if isinstance(m, TTLinear)}
    if cfg.init == "tt_svd" or teacher is None or not layers:
        return None
    budgeted = cfg.rank_allocation != "uniform"
    n_probe = cfg.probe_sentences if cfg.rank_allocation == "sensitivity" else 0
    calib, probes = take_sentences(batches, cfg.calibration_sentences, n_probe, device)
    seen = sum(int(ids.shape[0]) for ids, _, _ in calib)
    if seen == 0:
        raise ConfigError("data", "the training split has no sentences to calibrate on")
    calib = profile_first(calib, device)
    info: dict[str, Any] = {"init": cfg.init, "calibration_sentences": seen}
    caps = {n: max(m.ranks) for n, m in layers.items()}  # compression.max_rank, as built
    ranks = dict(caps)
    t0 = time.perf_counter()
    if budgeted:
        assert cfg.target_compression is not None  # the config checks it
        dense = sum(m.dense_parameters() for m in layers.values())
        probing: list[Batch] = []
        if n_probe:  # no sentences left after the calibration: the first of those (not all)
            probing, from_calibration = probe_batches(probes, calib, n_probe, device)
            if from_calibration:
                info["probes_from"] = "calibration"  # the training split had no more
        ranks, alloc = plan_ranks(
            model,
            teacher,
            calib,
            probing,
            mode=cfg.rank_allocation,
            budget=dense / cfg.target_compression,
            caps=caps,
            depth_gain=cfg.depth_gain,
        )
        info.update(alloc)
    t1 = time.perf_counter()
    if cfg.init == "sequential":
        info["layers"] = fit_sequential_(
            model,
            teacher,
            calib,
            ranks,
            ridge=RIDGE_SEQUENTIAL,
            residual=True,
            anchor=ANCHOR_SEQUENTIAL,
        )
    else:
        if budgeted:  # TT-SVD at the allocated ranks first: the whitened refit keeps them
            for name, layer in layers.items():
                new = TTLinear.from_linear(
                    teacher.get_submodule(name),
                    max_rank=ranks[name],
                    in_modes=layer.in_modes,
                    out_modes=layer.out_modes,
                    gate_threshold=layer.gate_threshold,
                    plan=layer.plan,
                )
                replace_module_(model, name, new)
        grams, _ = input_gram(teacher, list(layers), as_dicts(calib), sentences=seen, device=device)
        info["layers"] = whiten_tt_linears_(model, teacher, grams)
    info["seconds_allocation"] = round(t1 - t0, 3)
    info["seconds_fit"] = round(time.perf_counter() - t1, 3)
    info["ranks"] = {
        n: int(max(m.ranks)) for n, m in model.named_modules() if isinstance(m, TTLinear)
    }
    model.conversion = [
        layer_row(
            r["name"],
            model.get_submodule(r["name"]),
            teacher.get_submodule(r["name"]).weight.detach(),
        )
        for r in model.conversion
    ]
    model.preparation = info
    return info
