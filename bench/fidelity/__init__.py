"""Accuracy at a compression ratio on real data: dense vs CoMERA early vs late stages, with
the late stage's parts (stage-start teacher, the guard's back-off) ablated.

    python -m bench.fidelity [--reps N] [--datasets a,b] [--jobs 2] [--skip-encoder] [--out PATH]
                             [--layer-sets all,hidden.1] [--skip-text] [--text-reps N] [--update]

Every claim of "a smaller model at the same accuracy" is measured here, on data nobody here
generated and that installs offline (:mod:`bench.fidelity_data`): scikit-learn's digits,
breast cancer and wine, and MiniLM embeddings of standard-library docstrings labelled with
their package. Per data set and fold (``--reps`` of 5 stratified 80/20 folds), through
:class:`engine.train.Trainer` and the ``mlp`` workload (``hidden [256, 256]``, GELU, dropout
0.1, batch 64):

* layer sets (``--layer-sets``): ``all``, every tensorizable layer (``hidden.0`` and
  ``hidden.1``; the output layer stays dense), the protocol; ``hidden.1``, the one layer the
  benchmark tensorized before, for comparison;
* ``dense``: :func:`early_steps` steps of plain training (:data:`EARLY_STEPS`, or
  :data:`EARLY_EPOCHS` epochs of the split's training rows where that is more: a TT layer
  trained from scratch converges more slowly than a dense one, so the larger sets need the
  epochs);
* ``early``: the same steps of the CoMERA early stage with a stage ``target_ratio`` of
  :data:`EARLY_TARGET` (gradual cuts, see :mod:`engine.train.rank_control`), from the start
  ``--start`` names (:data:`STARTS`): ``auto``, the protocol, gives no ``max_rank``, ``d`` or
  ``gamma``, so the engine chooses them as for any user who gives only a target (ranks from a
  dense calibration run, TT linears of two cores, ``gamma: "auto"``); ``auto-d2``, the same
  in 2 + 2 cores (``d`` 2); ``rank64``, the protocol before, ``max_rank`` 64 and ``d`` 2;
* ``late-<t>/<variant>``: branches resumed from the early stage's final checkpoint: a late
  stage of :data:`LATE_STEPS` steps at target ratio ``t`` of the size at its start, under the
  fidelity guard (``max_metric_drop`` 1.0 point), then :data:`FINETUNE_STEPS` fine-tune steps.
  The variants (:data:`VARIANTS`) are the ablation: ``full`` (the stage-start teacher at
  weight :data:`TEACHER_WEIGHT` in the late and fine-tune stages, and the backing-off guard),
  ``no-teacher``, ``no-back-off`` (the guard's first failed check ends the stage at the last
  accepted model: :func:`guard_stops`) and ``neither``. :func:`plan` says which targets and
  variants run for a layer set: all four at 0.5 and 0.2 for ``all``, ``full`` alone at 0.8
  and for ``hidden.1``.

* ``room`` (layer set ``all``): the room probe of the 0.2 check, the early stage trained
  directly to ``EARLY_TARGET / ROOM``, a quarter of its own target. A fold counts in the 0.2
  check when it is shown to have that room: the probe ends within the tolerance of the late
  stage's start, or the late stage reaches 0.2 within it
  (:func:`bench.fidelity_summary.room_shown`).

One more row, ``stdlib_modules_text`` (``--skip-text`` leaves it out): the same sentences and
folds as ``stdlib_modules``, as raw text, for the ``transformer`` workload trained from
scratch (:func:`text_job`: a WordPiece vocabulary trained on the fold's training rows, every
linear of the encoder tensorized, from the automatic start and to :data:`TEXT_EARLY_TARGET`);
:data:`TEXT_REPS` folds and :data:`TEXT_VARIANTS` only, as a transformer step costs
~30x an MLP step.

Each row gives the validation accuracy (mean over the folds, and each fold), the ratio of
the tensorized layers (dense weights / TT core entries at the active ranks), the late stage's
own ratio (size at its end / at its start), whether the target was reached or the guard
stopped the stage and why, the guard's back-offs, and seconds. The acceptance checks
(:func:`checks`, :func:`ablation`) are evaluated and recorded (``checks``), failures included.
The pretrained-encoder part (MiniLM compressed 5x, fidelity on a text source it never saw) is
:mod:`bench.fidelity_encoder`, run from here unless ``--skip-encoder`` (which keeps the
``encoder`` entry of the results file as it was). Writes ``bench/results/fidelity.json``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bench import fidelity_data
from bench.fidelity_results import summarize
from bench.fidelity_summary import (
    ABLATION_TARGETS,
    MAIN,
    ROOM,
    TARGETS,
    TOLERANCE,
    VARIANTS,
)
from engine.train import JobConfig, Trainer
from engine.train.config import DEFAULT_AUTO_MAX_STEPS
from engine.train.guard import FidelityGuard

EARLY_STEPS, FINETUNE_STEPS = 720, 100
# the late stages are recovery-paced (steps "auto", at most the engine's default bound): at a
# fixed 300 steps of the cubic schedule, 4-5 back-offs spent the budget on digits and
# stdlib_modules in every fold (bench/README.md)
LATE_MAX_STEPS = DEFAULT_AUTO_MAX_STEPS
# stdlib_modules (2,856 training rows, 16 epochs in 720 steps), 5 splits: CoMERA early 84.09 vs
# dense 85.10 at 720 steps, 84.48 / 85.27 at 1,000, 84.82 / 85.24 at 1,340 (30 epochs); a TT
# layer at rank 64 without any cut (gamma 0) is as far behind at 720 (84.04)
EARLY_EPOCHS = 30
BATCH = 64
# of the start's size (the automatic start is larger than dense): 3.0-3.7x against dense. At 0.15
# (5.6-6.6x) stdlib_modules' early stage left under 2x of room: every late stage there, any
# budget, stops at ~10x against dense (at 0.5 1/5 folds, 2/5 with 4,000 steps), as do training
# at that size from scratch, bench.direct_size and one-shot SVD cuts (bench/README.md)
EARLY_TARGET = 0.3
# the transformer row's: its early stage at 0.15 (4.8x) left room for 0.2 in every fold
TEXT_EARLY_TARGET = 0.15
# the compression keys of the early stage's start (see the module doc): "auto", the protocol,
# none (the engine chooses, as for a user who gives only target_ratio); "auto-d2", the same in
# 2 + 2 cores; "rank64", the protocol before
STARTS: dict[str, dict[str, Any]] = {
    "auto": {},
    "auto-d2": {"d": 2},
    "rank64": {"max_rank": 64, "d": 2},
}
START = "auto"
LR = {"cores": 0.003, "gates": 0.01, "others": 0.001}
# the late stages' rates, of LR. At 1x the early checkpoint trained on with no cut falls
# 6.6-11.3 points on stdlib_modules and 2.2-4.7 on digits within 250 steps, at 0.3x it holds
# (bench.late_rates); but the whole protocol at 0.3x (fidelity_late_lr_0.3.json) lifts
# stdlib_modules only to 2/5 at 0.5 and drops the transformer row at 0.2 to 2/5: kept at 1x
LATE_LR_SCALE = 1.0
LR_SCHEDULE = "cosine"
TEACHER_WEIGHT = 1.0  # the variants with a teacher (late and finetune stages; temperature 2)
# the late stages' linear_d: None, the engine's default (2 + 2 cores for the automatic start's
# two, docs/method.md#late-refactor); 1 keeps two cores (the protocol before)
LATE_LINEAR_D: int | None = None
LAYER_SETS: dict[str, list[str]] = {"all": ["*"], "hidden.1": ["hidden.1"]}
# the transformer row: from scratch on the raw sentences of stdlib_modules
TEXT_MODEL = {"d_model": 64, "n_heads": 4, "d_ff": 128, "n_layers": 2, "max_len": 48}
TEXT_DATA = {"vocab_size": 4000, "max_len": 48}
# 60, not 30: at 30 epochs (1,337 steps) both runs were still learning and the TT model more
# so (folds 0 / 4: dense 69.36 / 70.42, early 66.57 / 67.04); at 60, dense 71.31 / 74.37,
# early 72.28 / 74.79 (bench/README.md)
TEXT_EARLY_EPOCHS = 60
TEXT_REPS = 5  # a fold of the transformer row costs ~7 minutes on one core
TEXT_VARIANTS = ("full", "neither")


def early_steps(n_train: int, epochs: int | None = None) -> int:
    """Steps of the early stage (and of its dense twin) on ``n_train`` training rows:
    :data:`EARLY_STEPS`, or ``epochs`` (default :data:`EARLY_EPOCHS`) where that is more."""
    epochs = EARLY_EPOCHS if epochs is None else epochs
    return max(EARLY_STEPS, math.ceil(epochs * n_train / BATCH))


def job(
    train: Path,
    valid: Path,
    method: str,
    seed: int,
    steps: int,
    layers: str = MAIN,
    start: str | None = None,
    target: float | None = None,
) -> dict[str, Any]:
    """The early-stage job (or its dense twin) of one split, ``steps`` long, the ``mlp``
    workload with the layer set ``layers`` (:data:`LAYER_SETS`) tensorized, from ``start``
    (:data:`STARTS`; default :data:`START`), to the stage ``target_ratio`` ``target``
    (default :data:`EARLY_TARGET`)."""
    start = START if start is None else start
    compression: dict[str, Any] = {
        "layers": LAYER_SETS[layers],
        **STARTS[start],
        "shrink_every": 25,
        "max_metric_drop": TOLERANCE,
    }
    early: dict[str, Any] = {"target_ratio": EARLY_TARGET if target is None else target}
    if start == "rank64":
        early["gamma"] = "auto"  # given: the automatic start leaves it to the engine
    return {
        "version": 1,
        "name": f"fidelity-{method}",
        "method": method,
        "model": {"arch": "mlp", "config": {"hidden": [256, 256], "dropout": 0.1}},
        "data": {"kind": "npz", "train": str(train), "valid": str(valid)},
        "compression": compression,
        "schedule": [
            {
                "kind": "early",
                "steps": steps,
                "lr": LR,
                "lr_schedule": LR_SCHEDULE,
                **(early if method == "comera" else {}),
            }
        ],
        "training": {"batch_size": BATCH, "seed": seed, "log_every": 50},
    }


def text_job(
    train: Path, valid: Path, method: str, seed: int, steps: int, layers: str = "encoder"
) -> dict[str, Any]:
    """The early-stage job (or its dense twin) of the ``transformer`` row: JSONL sentences,
    a WordPiece vocabulary trained on the training rows, every encoder linear tensorized, from
    the automatic start to :data:`TEXT_EARLY_TARGET`."""
    spec = job(train, valid, method, seed, steps, start="auto", target=TEXT_EARLY_TARGET)
    spec["model"] = {
        "arch": "transformer",
        "config": {**TEXT_MODEL, "num_classes": fidelity_data.PACKAGES, "dropout": 0.1},
    }
    spec["data"] = {
        "kind": "jsonl",
        "train": str(train),
        "valid": str(valid),
        "text_a": "text",
        "text_b": None,
        "label_field": "label",
        "labels": [str(i) for i in range(fidelity_data.PACKAGES)],
        **TEXT_DATA,
    }
    spec["compression"].update(layers=["encoder.*"])
    return spec


def late_job(base: dict[str, Any], target: float, variant: str = "full") -> dict[str, Any]:
    """``base`` (an early-stage job) with a late stage at ``target`` and a finetune after it,
    the teacher as ``variant`` says (:data:`VARIANTS`; the back-off is :func:`guard_stops`)."""
    teacher, _ = VARIANTS[variant]
    weight = {"teacher_weight": TEACHER_WEIGHT if teacher else 0.0}
    out = copy.deepcopy(base)
    out["name"] = f"fidelity-late-{target:g}-{variant}"
    out["schedule"] += [
        {
            "kind": "late",
            "steps": "auto",
            "max_steps": LATE_MAX_STEPS,
            "target_ratio": target,
            "lr": {k: v * LATE_LR_SCALE for k, v in LR.items()},
            **weight,
            **({"linear_d": LATE_LINEAR_D} if LATE_LINEAR_D is not None else {}),
        },
        {
            "kind": "finetune",
            "steps": FINETUNE_STEPS,
            "lr": {"cores": 0.001, "others": 5e-4},
            "lr_schedule": "cosine",
            **weight,
        },
    ]
    return out


def plan(layers: str, text: bool = False) -> list[tuple[float, str]]:
    """``(target, variant)`` of the late branches run for a layer set: every variant at the
    :data:`ABLATION_TARGETS` and ``full`` at 0.8 for the protocol's layer set; ``full`` at
    every target for the comparison layer set; :data:`TEXT_VARIANTS` for the text row."""
    if text:
        return [(t, v) for t in ABLATION_TARGETS for v in TEXT_VARIANTS]
    if layers != MAIN:
        return [(t, "full") for t in TARGETS]
    extra = [(t, "full") for t in TARGETS if t not in ABLATION_TARGETS]
    return extra + [(t, v) for t in ABLATION_TARGETS for v in VARIANTS]


@contextlib.contextmanager
def guard_stops() -> Iterator[None]:
    """The ablation without back-off: a failed check of the fidelity guard restores the last
    accepted model and ends the stage there (the guard before back-off existed), where the
    engine's guard retries with a smaller cut. Patches :meth:`FidelityGuard.back_off` in
    this process for the ``with`` block: a ``back_off`` decision becomes ``stop`` (the
    stage's final check, ``restore``, is the same in both)."""
    original = FidelityGuard.back_off

    def back_off(self: FidelityGuard, *args: Any, **kwargs: Any) -> dict[str, Any]:
        scale = self.lr_scale
        entry = original(self, *args, **kwargs)
        if entry["decision"] == "back_off":  # no retry: neither its cut nor its rates
            entry.update(decision="stop", next_cut=None, next_wait=None, next_lr_scale=None)
            entry["no_back_off"] = True
            self.lr_scale = scale
        return entry

    FidelityGuard.back_off = back_off  # type: ignore[method-assign]
    try:
        yield
    finally:
        FidelityGuard.back_off = original  # type: ignore[method-assign]


def run_split(
    name: str, rep: int, tmp: Path, x: Any, y: Any, layer_sets: tuple[str, ...] = (MAIN,)
) -> dict[str, dict[str, Any]]:
    """Every run of one fold: ``dense``, then per layer set ``<set>/early`` and its late
    branches ``<set>/late-<target>/<variant>`` (:func:`plan`)."""
    text = name in fidelity_data.TEXT_DATASETS
    if text:
        train, valid, info = fidelity_data.split_text(name, x, y, rep, tmp / "data")
        steps, make, sets = early_steps(info["train"], TEXT_EARLY_EPOCHS), text_job, ("encoder",)
    else:
        train, valid, info = fidelity_data.split(name, x, y, rep, tmp / "data")
        steps, make, sets = early_steps(info["train"]), job, layer_sets
    rows: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    spec = make(train, valid, "dense", rep, steps, sets[0])
    result = Trainer(JobConfig.from_dict(spec), workdir=tmp / f"{name}-{rep}-dense").run()
    rows["dense"] = summarize(result, time.perf_counter() - t0)
    for layers in sets:
        t0 = time.perf_counter()
        work = tmp / f"{name}-{rep}-{layers}-comera"
        base = make(train, valid, "comera", rep, steps, layers)
        result = Trainer(JobConfig.from_dict(base), workdir=work).run()
        rows[f"{layers}/early"] = summarize(result, time.perf_counter() - t0)
        if not text and layers == MAIN:  # the room probe of the 0.2 check (room_shown)
            t0 = time.perf_counter()
            probe = job(train, valid, "comera", rep, steps, layers, target=EARLY_TARGET / ROOM)
            probe["name"] = "fidelity-room"
            result = Trainer(
                JobConfig.from_dict(probe), workdir=work.with_name(work.name + "-room")
            )
            rows[f"{layers}/room"] = summarize(result.run(), time.perf_counter() - t0)
        early_ckpt = work / "checkpoints" / "final.safetensors"
        vocab = [p.relative_to(work) for p in work.rglob("tokenizer.json")] if text else []
        for target, variant in plan(layers, text):
            t0 = time.perf_counter()
            spec = late_job(base, target, variant)
            branch = tmp / f"{name}-{rep}-{layers}-late-{target:g}-{variant}"
            for rel in vocab:  # the branch reuses the early stage's vocabulary (same config)
                (branch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(work / rel, branch / rel)
            stops = guard_stops() if not VARIANTS[variant][1] else contextlib.nullcontext()
            with stops:
                result = Trainer(JobConfig.from_dict(spec), workdir=branch, resume=early_ckpt)
                result = result.run()
            rows[f"{layers}/late-{target:g}/{variant}"] = summarize(
                result, time.perf_counter() - t0
            )
    rows["split"] = {**info, "early_steps": steps}
    return rows


def set_protocol_and_threads(
    early_steps: int,
    lr_schedule: str,
    start: str,
    late_d: int | None,
    early_target: float,
    late_max_steps: int,
    threads: int,
) -> None:
    """:func:`set_protocol` and the torch threads of a spawned process that runs folds."""
    set_protocol(early_steps, lr_schedule, start, late_d, early_target, late_max_steps)
    torch.set_num_threads(threads)


def set_protocol(
    early_steps: int,
    lr_schedule: str,
    start: str = "auto",
    late_d: int | None = None,
    early_target: float | None = None,
    late_max_steps: int | None = None,
) -> None:
    """Set the protocol's constants the command line may change (in this process; the folds'
    processes call it through :func:`set_protocol_and_threads`)."""
    global EARLY_STEPS, LR_SCHEDULE, START, LATE_LINEAR_D, EARLY_TARGET, LATE_MAX_STEPS
    EARLY_STEPS, LR_SCHEDULE, START, LATE_LINEAR_D = early_steps, lr_schedule, start, late_d
    EARLY_TARGET = EARLY_TARGET if early_target is None else early_target
    LATE_MAX_STEPS = LATE_MAX_STEPS if late_max_steps is None else late_max_steps
