"""A job that gives only ``target_ratio`` against its dense twin, on real data.

    python -m bench.auto_defaults [--reps N] [--datasets a,b] [--jobs 2] [--threads 1]

The claim measured: "a job with only ``target_ratio`` set (no ``max_rank``, no ``gamma``) on
each real data set lands its early stage within 1.0 point of the dense twin". Per MLP data set
of :mod:`bench.fidelity_data` and fold (``--reps`` of its 5 stratified folds, cut as
:func:`bench.fidelity.run_split` cuts them), through :class:`engine.train.Trainer`:

* ``dense``: :func:`bench.fidelity.job` with method ``dense``, :func:`bench.fidelity.early_steps`
  steps (the dense twin of :mod:`bench.fidelity`, the same run);
* ``defaults``: the same job with method ``comera`` whose ``compression`` gives the layers
  (``["*"]``), ``shrink_every`` and ``max_metric_drop`` and no ``max_rank`` and no ``d``, and a
  single early stage with ``target_ratio`` :data:`TARGET` and no ``gamma``
  (:func:`defaults_job`). The engine then picks ``max_rank: "auto"`` (a dense calibration run
  chooses the ranks, and the TT linears have two cores, docs/method.md#automatic-rank) and
  ``gamma: "auto"``; each fold checks that it did (the
  job's config and the report's ``auto_rank`` entry) and fails loudly otherwise. The dense
  twin's accuracy is handed to the run (``control.dense_reference``, as a caller that ran the
  twin does) so the stage's ``advice`` can say when it ended under it; training is unchanged.

Per fold: both accuracies, the difference in points (defaults - dense), the tensorized ratio,
the auto ranks (per layer rank, TT-SVD error, ``capped``, ``build_rank``) and the final active
ranks, the stage's ``advice`` if any, seconds. Per data set: the means, the folds within
:data:`TOLERANCE` point (at most that far under dense; above it counts as within) and the
check ``within_1_point_on_average``. Writes ``bench/results/auto_defaults.json``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench import fidelity, fidelity_data
from bench.fidelity_summary import MAIN, TOLERANCE
from engine.train import JobConfig, Trainer

# 0.15: bench.fidelity's early target before its MLP rows moved to 0.3, the harder of the two
TARGET = 0.15


def defaults_job(train: Path, valid: Path, seed: int, steps: int) -> dict[str, Any]:
    """:func:`bench.fidelity.job`'s CoMERA early stage from the automatic start (the engine's
    defaults: no ``max_rank``, no ``d``, no ``gamma``, only the stage's ``target_ratio``,
    :data:`TARGET`)."""
    spec = fidelity.job(train, valid, "comera", seed, steps, MAIN, start="auto", target=TARGET)
    spec["name"] = "auto-defaults"
    return spec


def _auto_rank(report: dict[str, Any]) -> dict[str, Any]:
    auto = report.get("auto_rank")
    if not auto:
        raise RuntimeError("the defaults job ran without max_rank 'auto': no auto_rank entry")
    return {
        "build_rank": auto["build_rank"],
        "capped": auto["capped"],
        "probe_steps": auto["probe"].get("steps"),
        "layers": auto["layers"],
    }


def run_fold(name: str, rep: int, tmp: Path, x: Any, y: Any) -> dict[str, Any]:
    """The dense twin and the defaults job of fold ``rep`` of data set ``name``."""
    train, valid, info = fidelity_data.split(name, x, y, rep, tmp / "data")
    steps = fidelity.early_steps(info["train"])
    config = JobConfig.from_dict(defaults_job(train, valid, rep, steps))
    chosen = {"max_rank": config.compression.options.max_rank, "gamma": config.schedule[0].gamma}
    if chosen != {"max_rank": "auto", "gamma": "auto"}:
        raise RuntimeError(f"the engine did not pick the automatic defaults: {chosen}")
    t0 = time.perf_counter()
    spec = fidelity.job(train, valid, "dense", rep, steps, MAIN)
    result = Trainer(JobConfig.from_dict(spec), workdir=tmp / f"{name}-{rep}-dense").run()
    dense = fidelity.summarize(result, time.perf_counter() - t0)
    t0 = time.perf_counter()
    trainer = Trainer(config, workdir=tmp / f"{name}-{rep}-defaults")
    trainer.control.dense_reference = {"accuracy": dense["accuracy"]}  # report only: advice
    result = trainer.run()
    seconds = time.perf_counter() - t0
    row = fidelity.summarize(result, seconds)
    stage = result.report["stages"][0]
    diff = 100.0 * (row["accuracy"] - dense["accuracy"])
    return {
        "fold": rep,
        "dense_accuracy": dense["accuracy"],
        "defaults_accuracy": row["accuracy"],
        "diff_points": diff,
        "within_1_point": diff >= -TOLERANCE,
        "ratio": row["ratio"],
        "model_ratio": row["model_ratio"],
        "target_reached": row.get("early_target_reached"),
        "chosen": chosen,
        "auto_rank": _auto_rank(result.report),
        "ranks": row["ranks"],
        "gamma": stage.get("gamma"),
        "advice": stage.get("advice"),
        "seconds": {"dense": dense["seconds"], "defaults": round(seconds, 2)},
        "split": {**info, "early_steps": steps},
    }


def summarize_dataset(folds: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the folds, the folds within :data:`TOLERANCE` and the check."""

    def mean(key: str) -> float:
        return statistics.fmean(f[key] for f in folds)

    within = sum(f["within_1_point"] for f in folds)
    diff = mean("diff_points")
    return {
        "dense_accuracy": mean("dense_accuracy"),
        "defaults_accuracy": mean("defaults_accuracy"),
        "diff_points": diff,
        "ratio": mean("ratio"),
        "build_rank": statistics.fmean(f["auto_rank"]["build_rank"] for f in folds),
        "folds_within_1_point": within,
        "folds": len(folds),
        "folds_with_advice": sum(f["advice"] is not None for f in folds),
        "folds_target_reached": sum(bool(f["target_reached"]) for f in folds),
        "seconds": statistics.fmean(
            f["seconds"]["dense"] + f["seconds"]["defaults"] for f in folds
        ),
        "checks": {
            "within_1_point_on_average": diff >= -TOLERANCE,
            "folds_within_1_point": f"{within}/{len(folds)}",
        },
    }


def print_markdown(payload: dict[str, Any]) -> None:
    print(
        "| data set | dense % | defaults % | diff (points) | within 1 point | ratio "
        "| auto build rank | advice | s / fold |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, d in payload["datasets"].items():
        s = d["summary"]
        print(
            f"| {name} | {100 * s['dense_accuracy']:.2f} | {100 * s['defaults_accuracy']:.2f} "
            f"| {s['diff_points']:+.2f} | {s['folds_within_1_point']}/{s['folds']} "
            f"| {s['ratio']:.1f}x | {s['build_rank']:g} "
            f"| {s['folds_with_advice']}/{s['folds']} | {s['seconds']:.0f} |"
        )
    c = payload["checks"]
    print(
        f"\nwithin 1 point on average: {c['datasets_within_1_point_on_average']}; "
        f"folds within 1 point: {c['folds_within_1_point']}; {payload['seconds']:.0f} s"
    )


def describe(datasets: dict[str, Any]) -> dict[str, Any]:
    """The claim, the protocol and the checks of the results file
    (:func:`fidelity_data.fold_benchmark`)."""
    within = {n: d["summary"]["checks"]["within_1_point_on_average"] for n, d in datasets.items()}
    return {
        "claim": (
            "a job with only target_ratio set (no max_rank, no gamma) on each real data set "
            "lands its early stage within 1.0 point of the dense twin"
        ),
        "protocol": {
            "early_steps": fidelity.EARLY_STEPS,
            "early_epochs_at_least": fidelity.EARLY_EPOCHS,
            "target_ratio": TARGET,
            "tolerance_points": TOLERANCE,
            "within": "defaults accuracy at most 1.0 point under the dense twin's (above counts)",
            "dense_job": fidelity.job(
                Path("TRAIN.npz"), Path("VALID.npz"), "dense", 0, fidelity.EARLY_STEPS, MAIN
            ),
            "defaults_job": defaults_job(
                Path("TRAIN.npz"), Path("VALID.npz"), 0, fidelity.EARLY_STEPS
            ),
        },
        "checks": {
            "datasets_within_1_point_on_average": f"{sum(within.values())}/{len(within)}",
            "within_1_point_on_average": within,
            "folds_within_1_point": (
                f"{sum(d['summary']['folds_within_1_point'] for d in datasets.values())}"
                f"/{sum(d['summary']['folds'] for d in datasets.values())}"
            ),
        },
    }


def main() -> None:
    payload = fidelity_data.fold_benchmark(
        "auto_defaults", __doc__, run_fold, summarize_dataset, describe
    )
    print_markdown(payload)


if __name__ == "__main__":
    main()
