"""The command line of :mod:`bench.fidelity` (``python -m bench.fidelity``): the folds run
side by side, the results file with its protocol, checks and ablation, and the tables.

The protocol's constants live in :mod:`bench.fidelity`; the options that change them set
them there, in this process and in every spawned one (:func:`bench.fidelity.set_protocol`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch

from bench import fidelity as F
from bench import fidelity_data, fidelity_encoder
from bench.common import machine_info, map_spawned, write_json
from bench.fidelity_results import merge_update, previous_results
from bench.fidelity_summary import (
    MAIN,
    ROOM,
    TOLERANCE,
    VARIANTS,
    ablation,
    aggregate,
    checks,
    print_dataset,
    print_markdown,
    summary_checks,
)

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fidelity", description=F.__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--reps", type=int, default=fidelity_data.FOLDS, help="folds run per data set (<= 5)"
    )
    parser.add_argument("--datasets", default=",".join(fidelity_data.DATASETS))
    parser.add_argument("--layer-sets", default=",".join(F.LAYER_SETS))
    parser.add_argument("--skip-encoder", action="store_true")
    parser.add_argument("--skip-text", action="store_true", help="no transformer row")
    parser.add_argument("--text-reps", type=int, default=F.TEXT_REPS)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, MLP runs")
    parser.add_argument("--jobs", type=int, default=2, help="MLP splits run side by side")
    parser.add_argument("--encoder-threads", type=int, default=2, help="torch threads, MiniLM")
    parser.add_argument("--out", default=None)
    parser.add_argument("--early-steps", type=int, default=F.EARLY_STEPS)
    parser.add_argument("--lr-schedule", default=F.LR_SCHEDULE, choices=("constant", "cosine"))
    parser.add_argument(
        "--early-target", type=float, default=F.EARLY_TARGET, help="the early stage's target_ratio"
    )
    parser.add_argument(
        "--late-max-steps", type=int, default=F.LATE_MAX_STEPS, help="the late stages' max_steps"
    )
    parser.add_argument(
        "--start", default=F.START, choices=tuple(F.STARTS), help="the MLP early stage's start"
    )
    parser.add_argument(
        "--late-linear-d", type=int, help="late stages' linear_d (default: engine's)"
    )
    parser.add_argument("--note", default=None, help="recorded in the JSON (a partial run)")
    parser.add_argument(
        "--update",
        action="store_true",
        help="replace only the data sets run now in the results file (keep the others)",
    )
    args = parser.parse_args()
    F.set_protocol_and_threads(*_protocol(args))
    t_all = time.perf_counter()
    results: dict[str, Any] = {}
    sets = tuple(args.layer_sets.split(","))
    names = [n for n in args.datasets.split(",") if n]
    if not args.skip_text:
        names += [n for n in fidelity_data.TEXT_DATASETS if n not in names]
    with TemporaryDirectory() as tmp:
        loaded = {
            n: fidelity_data.load_text(n)
            if n in fidelity_data.TEXT_DATASETS
            else fidelity_data.load(n)
            for n in names
        }
        reps = {n: args.text_reps if n in fidelity_data.TEXT_DATASETS else args.reps for n in names}
        # the transformer folds first: the longest runs start while the pool is empty
        order = sorted(names, key=lambda n: n not in fidelity_data.TEXT_DATASETS)
        work = [(n, rep, Path(tmp), *loaded[n][:2], sets) for n in order for rep in range(reps[n])]
        done = dict(zip(((w[0], w[1]) for w in work), run_splits(work, args), strict=True))
        for name in names:
            x, y, info = loaded[name]
            splits = [done[name, rep] for rep in range(reps[name])]
            agg = aggregate(splits)
            text = name in fidelity_data.TEXT_DATASETS
            layer_sets = ("encoder",) if text else sets
            results[name] = {
                "info": {
                    **info,
                    "rows": int(len(y)),
                    "n_classes": len(set(y.tolist())),
                    "workload": "transformer" if text else "mlp",
                    **splits[0]["split"],
                },
                "runs": agg,
                "splits": splits,
                "checks": {ls: checks(name, agg, splits, ls) for ls in layer_sets},
                # the runs' own times (the splits may run side by side: --jobs)
                "seconds": round(sum(r["seconds"] for r in agg.values()), 1),
            }
            print_dataset(name, results[name])
    previous = previous_results(args.out)
    if args.update:  # the data sets run now replace theirs; the others stay as they were
        kept = {n: r for n, r in previous.get("datasets", {}).items() if n not in results}
        for name, res in kept.items():  # their checks as defined now, from their runs
            res["checks"] = {
                ls: checks(name, res["runs"], res["splits"], ls) for ls in res["checks"]
            }
        results = {**previous.get("datasets", {}), **results}
    mlp = {n: r for n, r in results.items() if n not in fidelity_data.TEXT_DATASETS}
    text_rows = {n: r for n, r in results.items() if n in fidelity_data.TEXT_DATASETS}
    abl = {"mlp": ablation(mlp), "transformer": ablation(text_rows, "encoder")}
    encoder = None
    if not args.skip_encoder:
        encoder = fidelity_encoder.run(threads=args.encoder_threads)
        fidelity_encoder.print_table(encoder)
        torch.set_num_threads(args.threads)
    elif previous.get("encoder"):  # --skip-encoder keeps the last MiniLM pass
        encoder = {**previous["encoder"], "kept_from_previous_run": True}
    payload = {
        "benchmark": "fidelity",
        "machine": machine_info(),
        "note": args.note,
        "protocol": {
            "reps": args.reps,
            "text_reps": 0 if args.skip_text else args.text_reps,
            "jobs": args.jobs,
            "layer_sets": {s: F.LAYER_SETS[s] for s in sets},
            "main_layer_set": MAIN,
            "early_steps": F.EARLY_STEPS,
            "early_epochs_at_least": F.EARLY_EPOCHS,
            "late_steps": "auto",
            "late_max_steps": F.LATE_MAX_STEPS,
            "finetune_steps": F.FINETUNE_STEPS,
            "start": F.START,
            "late_linear_d": F.LATE_LINEAR_D,
            "late_lr_scale": F.LATE_LR_SCALE,
            "early_target": F.EARLY_TARGET,
            "tolerance_points": TOLERANCE,
            "room_for_the_0.2_check": ROOM,
            "room_probe_target": F.EARLY_TARGET / ROOM,
            "teacher_weight": F.TEACHER_WEIGHT,
            "variants": {v: {"teacher": t, "back_off": b} for v, (t, b) in VARIANTS.items()},
            "plan": {s: [f"late-{t:g}/{v}" for t, v in F.plan(s)] for s in sets},
            "job": F.job(Path("TRAIN.npz"), Path("VALID.npz"), "comera", 0, F.EARLY_STEPS),
            "text_job": F.text_job(
                Path("TRAIN.jsonl"), Path("VALID.jsonl"), "comera", 0, F.EARLY_STEPS
            ),
            "text_plan": [f"late-{t:g}/{v}" for t, v in F.plan("encoder", text=True)],
            "text_early_epochs_at_least": F.TEXT_EARLY_EPOCHS,
        },
        "datasets": results,
        "ablation": abl,
        "checks": summary_checks(results, abl),
        "encoder": encoder,
        "seconds": round(time.perf_counter() - t_all, 1),
    }
    if args.update and previous:
        merge_update(payload, previous, names, args)
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    else:
        write_json("fidelity", payload)
    print_markdown(payload)


def run_splits(work: list[tuple], args: argparse.Namespace) -> list[dict[str, dict[str, Any]]]:
    """:func:`bench.fidelity.run_split` of every ``(name, rep, tmp, x, y, layer_sets)``, in order;
    ``args.jobs`` processes of ``args.threads`` torch threads each run them side by side
    (spawned: no forked torch)."""
    return map_spawned(F.run_split, work, args.jobs, F.set_protocol_and_threads, _protocol(args))


def _protocol(args: argparse.Namespace) -> tuple:
    """The arguments of :func:`bench.fidelity.set_protocol_and_threads` the options give (this
    process and every spawned one set the same)."""
    return (
        args.early_steps,
        args.lr_schedule,
        args.start,
        args.late_linear_d,
        args.early_target,
        args.late_max_steps,
        args.threads,
    )


if __name__ == "__main__":
    main()
