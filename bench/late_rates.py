"""Do a late stage's learning rates alone cost accuracy? The early checkpoint of
:mod:`bench.fidelity` trained on with no cut at all, at its early stage's peak rates and at
fractions of them, judged every prune interval as the fidelity guard judges a cut.

    python -m bench.late_rates [--reps N] [--datasets a,b] [--jobs 2] [--threads 1]

A late stage that starts at the early stage's peak rates, after the early stage's cosine
took them to about 0, jumps; where it keeps none of its cuts, its guard may be judging that
jump, not the cuts (the report's ``lower_late_lr`` advice:
:func:`engine.train.report.late_stage_advice`). This benchmark is the control for
:mod:`bench.fidelity`, whose late stages run at :data:`bench.fidelity.LATE_LR_SCALE` of those
rates. Per MLP data
set of :mod:`bench.fidelity_data` and fold (layer set ``all``, the automatic start, the early
stage of :func:`bench.fidelity.early_steps` steps), from that early stage's final checkpoint,
a ``finetune`` stage of :data:`STEPS` steps (no cut: a finetune has none; its gates do not
train, and no teacher) at :data:`SCALES` times :data:`bench.fidelity.LR`, the validation
accuracy every :data:`INTERVAL` steps (the fidelity runs' prune interval).

Per data set and scale: the accuracy at the stage start, the points under it at the first
judgement and at the worst, and the folds whose every judgement is within
:data:`bench.fidelity_summary.TOLERANCE` of the start (a guard would have accepted an uncut
model there). Writes ``bench/results/late_rates.json``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench import fidelity, fidelity_data
from bench.fidelity_summary import MAIN, TOLERANCE
from engine.train import FunctionCallback, JobConfig, Trainer

SCALES = (1.0, 0.3, 0.1)  # of the fidelity early stage's rates (fidelity.LR)
STEPS = 250  # ten judgements
INTERVAL = 25  # compression.shrink_every of the fidelity jobs: their guard's interval


def control_job(base: dict[str, Any], scale: float) -> dict[str, Any]:
    """``base`` (the early-stage job) and a finetune of :data:`STEPS` steps at ``scale`` times
    the early stage's rates, evaluated every :data:`INTERVAL` steps."""
    spec = {**base, "name": f"late-rates-{scale:g}"}
    spec["schedule"] = [
        *base["schedule"],
        {
            "kind": "finetune",
            "steps": STEPS,
            "lr": {k: v * scale for k, v in fidelity.LR.items()},
            "eval_every": INTERVAL,
        },
    ]
    return spec


def run_fold(name: str, rep: int, tmp: Path, x: Any, y: Any) -> dict[str, Any]:
    """The early stage of fold ``rep`` of ``name``, then the uncut control at every scale."""
    train, valid, info = fidelity_data.split(name, x, y, rep, tmp / "data")
    steps = fidelity.early_steps(info["train"])
    base = fidelity.job(train, valid, "comera", rep, steps, MAIN, start="auto")
    work = tmp / f"{name}-{rep}-early"
    start = Trainer(JobConfig.from_dict(base), workdir=work).run().report["stages"][-1]
    ckpt = work / "checkpoints" / "final.safetensors"
    runs: dict[str, Any] = {}
    for scale in SCALES:
        evals: dict[int, float] = {}  # by step (the stage's end repeats the last interval's)

        def seen(event: dict[str, Any], into: dict[int, float] = evals) -> None:
            if event["event"] == "eval" and event["kind"] == "finetune":
                into[event["step"]] = event["valid_accuracy"]

        t0 = time.perf_counter()
        spec = JobConfig.from_dict(control_job(base, scale))
        workdir = tmp / f"{name}-{rep}-{scale:g}"
        Trainer(spec, workdir=workdir, resume=ckpt, callbacks=[FunctionCallback(seen)]).run()
        runs[f"{scale:g}"] = {
            "steps": sorted(evals),
            "accuracy": [evals[k] for k in sorted(evals)],
            "seconds": round(time.perf_counter() - t0, 2),
        }
    return {
        "fold": rep,
        "start": start["metrics"]["accuracy"],
        "size": start["size_end"],
        "runs": runs,
        "split": {**info, "early_steps": steps},
    }


def summarize_dataset(folds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scale: the start, the points under it at the first and the worst judgement, and
    the folds whose every judgement is within the tolerance."""
    out: dict[str, Any] = {"start": statistics.fmean(f["start"] for f in folds)}
    for scale in (f"{s:g}" for s in SCALES):
        first = [100.0 * (f["start"] - f["runs"][scale]["accuracy"][0]) for f in folds]
        worst = [100.0 * (f["start"] - min(f["runs"][scale]["accuracy"])) for f in folds]
        out[scale] = {
            "first_drop_points": first,
            "worst_drop_points": worst,
            "mean_first_drop_points": statistics.fmean(first),
            "mean_worst_drop_points": statistics.fmean(worst),
            "folds_always_within": sum(w <= TOLERANCE + 1e-9 for w in worst),
            "folds": len(folds),
        }
    return out


def print_markdown(payload: dict[str, Any]) -> None:
    print("| data set | start | rates | first judgement | worst | folds always within 1 point |")
    # points against the start, mean over the folds
    print("|---|---|---|---|---|---|")
    for name, d in payload["datasets"].items():
        s = d["summary"]
        for scale in (f"{x:g}" for x in SCALES):
            r = s[scale]
            print(
                f"| {name} | {100 * s['start']:.2f}% | {scale}x "
                f"| {-r['mean_first_drop_points'] + 0.0:+.2f} "
                f"| {-r['mean_worst_drop_points'] + 0.0:+.2f} "
                f"| {r['folds_always_within']}/{r['folds']} |"
            )
    print(f"\n{payload['seconds']:.0f} s")


def describe(datasets: dict[str, Any]) -> dict[str, Any]:
    """The question and the protocol of the results file (:func:`fidelity_data.fold_benchmark`)."""
    base = fidelity.job(Path("TRAIN.npz"), Path("VALID.npz"), "comera", 0, fidelity.EARLY_STEPS)
    return {
        "question": (
            "does the early checkpoint, trained on with no cut at the late stages' rates, stay "
            "within the fidelity guard's tolerance of its own accuracy"
        ),
        "protocol": {
            "scales": list(SCALES),
            "steps": STEPS,
            "interval": INTERVAL,
            "tolerance_points": TOLERANCE,
            "job": control_job(base, 1.0),
        },
    }


def main() -> None:
    payload = fidelity_data.fold_benchmark(
        "late_rates", __doc__, run_fold, summarize_dataset, describe
    )
    print_markdown(payload)


if __name__ == "__main__":
    main()
