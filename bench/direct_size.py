"""Can a model of the late stage's target size hold the accuracy at all? The early stage
trained directly to that size, against the one the late stages start from, on real data.

    python -m bench.direct_size [--reps N] [--datasets a,b] [--jobs 2] [--threads 1]

:mod:`bench.fidelity` asks each late stage to reach ``target_ratio`` ``t`` of its start within
1.0 point of the start's accuracy. Where it does not, the cause is either the late stage (its
cuts, recovery, guard) or the size itself: a model that small, of that form, may not hold the
accuracy however it is reached. This benchmark separates the two. Per MLP data set of
:mod:`bench.fidelity_data` and fold (``--reps`` of its 5 stratified folds, cut as
:mod:`bench.fidelity` cuts them), from the automatic start (:func:`bench.fidelity.job`,
``start="auto"``: no ``max_rank``, ``d`` or ``gamma``), the CoMERA early stage of
:func:`bench.fidelity.early_steps` steps at ``target_ratio`` ``EARLY_TARGET * t`` for each
``t`` of :data:`FACTORS`: ``t = 1`` is the early stage the late branches start from (the same
run as theirs), ``0.5`` and ``0.2`` land directly at the sizes of the late targets.

Per data set and ``t``: the mean accuracy and size, the difference in points against ``t = 1``
fold by fold, and the folds within :data:`bench.fidelity_summary.TOLERANCE` of it (the late
stage's own bar). Writes ``bench/results/direct_size.json``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench import fidelity, fidelity_data
from bench.fidelity_summary import MAIN, TOLERANCE
from engine.train import JobConfig, Trainer

FACTORS = (1.0, 0.5, 0.2)  # of the early stage's target: its own, and the late targets'


def size_job(train: Path, valid: Path, seed: int, steps: int, factor: float) -> dict[str, Any]:
    """The automatic start's early stage of :mod:`bench.fidelity` at ``EARLY_TARGET * factor``."""
    target = fidelity.EARLY_TARGET * factor
    spec = fidelity.job(train, valid, "comera", seed, steps, MAIN, start="auto", target=target)
    spec["name"] = f"direct-size-{factor:g}"
    return spec


def run_fold(name: str, rep: int, tmp: Path, x: Any, y: Any) -> dict[str, Any]:
    """Every factor of fold ``rep`` of data set ``name``: accuracy, size, ratio, seconds."""
    train, valid, info = fidelity_data.split(name, x, y, rep, tmp / "data")
    steps = fidelity.early_steps(info["train"])
    runs: dict[str, Any] = {}
    for factor in FACTORS:
        t0 = time.perf_counter()
        spec = size_job(train, valid, rep, steps, factor)
        result = Trainer(JobConfig.from_dict(spec), workdir=tmp / f"{name}-{rep}-{factor:g}")
        row = fidelity.summarize(result.run(), time.perf_counter() - t0)
        runs[f"{factor:g}"] = {
            "accuracy": row["accuracy"],
            "size": row["size"],
            "ratio": row["ratio"],
            "target_reached": row.get("early_target_reached"),
            "ranks": row["ranks"],
            "seconds": row["seconds"],
        }
    return {"fold": rep, "runs": runs, "split": {**info, "early_steps": steps}}


def summarize_dataset(folds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per factor: means, the points against ``t = 1`` per fold, and the folds within."""
    out: dict[str, Any] = {}
    for factor in (f"{f:g}" for f in FACTORS):
        diffs = [
            100.0 * (f["runs"][factor]["accuracy"] - f["runs"]["1"]["accuracy"]) for f in folds
        ]
        out[factor] = {
            "accuracy": statistics.fmean(f["runs"][factor]["accuracy"] for f in folds),
            "size": statistics.fmean(f["runs"][factor]["size"] for f in folds),
            "ratio": statistics.fmean(f["runs"][factor]["ratio"] for f in folds),
            "diff_points": diffs,
            "mean_diff_points": statistics.fmean(diffs),
            "folds_within_1_point": sum(d >= -TOLERANCE for d in diffs),
            "folds_target_reached": sum(bool(f["runs"][factor]["target_reached"]) for f in folds),
            "folds": len(folds),
        }
    return out


def print_markdown(payload: dict[str, Any]) -> None:
    print("| data set | t | accuracy | size | ratio | points vs t = 1 | within 1 point |")
    print("|---|---|---|---|---|---|---|")
    for name, d in payload["datasets"].items():
        for factor, s in d["summary"].items():
            print(
                f"| {name} | {factor} | {100 * s['accuracy']:.2f}% | {s['size']:,.0f} "
                f"| {s['ratio']:.1f}x | {s['mean_diff_points']:+.2f} "
                f"| {s['folds_within_1_point']}/{s['folds']} |"
            )
    print(f"\n{payload['seconds']:.0f} s")


def describe(datasets: dict[str, Any]) -> dict[str, Any]:
    """The question and the protocol of the results file (:func:`fidelity_data.fold_benchmark`)."""
    return {
        "question": (
            "does a model of the late stage's target size, trained directly to it by the early "
            "stage, hold the accuracy of the model the late stages start from"
        ),
        "protocol": {
            "factors": list(FACTORS),
            "early_target": fidelity.EARLY_TARGET,
            "tolerance_points": TOLERANCE,
            "job": size_job(Path("TRAIN.npz"), Path("VALID.npz"), 0, fidelity.EARLY_STEPS, 0.5),
        },
    }


def main() -> None:
    payload = fidelity_data.fold_benchmark(
        "direct_size", __doc__, run_fold, summarize_dataset, describe
    )
    print_markdown(payload)


if __name__ == "__main__":
    main()
