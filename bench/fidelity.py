"""Accuracy at a compression ratio on real data: dense vs CoMERA early vs late at 0.8/0.5/0.2.

    python -m bench.fidelity [--reps N] [--datasets a,b] [--jobs 2] [--skip-encoder] [--out PATH]

Every claim of "a smaller model at the same accuracy" is measured here, on data nobody here
generated and that installs offline (:mod:`bench.fidelity_data`): scikit-learn's digits,
breast cancer and wine, and MiniLM embeddings of standard-library docstrings labelled with
their package. Per data set and split (``--reps`` stratified 80/20 splits), through
:class:`engine.train.Trainer` and the ``mlp`` workload (``hidden [256, 256]``, GELU, dropout
0.1, batch 64, the input layer dense and ``hidden.1`` a TT layer of 2 + 2 cores):

* ``dense``: :func:`early_steps` steps of plain training (:data:`EARLY_STEPS`, or
  :data:`EARLY_EPOCHS` epochs of the split's training rows where that is more: a TT layer
  trained from scratch converges more slowly than a dense one, so the larger sets need the
  epochs);
* ``early``: the same steps of the CoMERA early stage from rank 64, ``gamma: "auto"`` with a
  stage ``target_ratio`` of :data:`EARLY_TARGET` (gradual cuts, see
  :mod:`engine.train.rank_control`);
* ``late-0.8`` / ``late-0.5`` / ``late-0.2``: branches resumed from the early stage's final
  checkpoint: a late stage of :data:`LATE_STEPS` steps at that target ratio of the size at its
  start, under the fidelity guard (``max_metric_drop`` 1.0 point), then
  :data:`FINETUNE_STEPS` fine-tune steps.

Each row gives the validation accuracy (mean over the splits, and each split), the ratio of
the tensorized layer (dense weights / TT core entries at the active ranks), S against S*,
whether the target was reached or the guard stopped the stage and why, and seconds. The
acceptance checks are evaluated and recorded (``checks``). The pretrained-encoder part (MiniLM
compressed 5x, fidelity on a text source it never saw) is :mod:`bench.fidelity_encoder`,
run from here unless ``--skip-encoder``. Writes ``bench/results/fidelity.json``.
"""

from __future__ import annotations

import argparse
import copy
import math
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch

from bench import fidelity_data, fidelity_encoder
from bench.common import machine_info, write_json
from engine.train import JobConfig, Trainer

EARLY_STEPS, LATE_STEPS, FINETUNE_STEPS = 720, 300, 100
# stdlib_modules (2,856 training rows, 16 epochs in 720 steps), 5 splits: CoMERA early 84.09 vs
# dense 85.10 at 720 steps, 84.48 / 85.27 at 1,000, 84.82 / 85.24 at 1,340 (30 epochs); a TT
# layer at rank 64 without any cut (gamma 0) is as far behind at 720 (84.04)
EARLY_EPOCHS = 30
BATCH = 64
EARLY_TARGET = 0.15  # rank 64 of a 256 x 256 TT layer is 2.0x; 0.15 of that is ~13x
TARGETS = (0.8, 0.5, 0.2)
TOLERANCE = 1.0  # accuracy points: the guard's max_metric_drop and the checks' tolerance
LR = {"cores": 0.003, "gates": 0.01, "others": 0.001}
LR_SCHEDULE = "cosine"


def early_steps(n_train: int) -> int:
    """Steps of the early stage (and of its dense twin) on ``n_train`` training rows."""
    return max(EARLY_STEPS, math.ceil(EARLY_EPOCHS * n_train / BATCH))


def job(train: Path, valid: Path, method: str, seed: int, steps: int) -> dict[str, Any]:
    """The early-stage job (or its dense twin) of one split, ``steps`` long."""
    return {
        "version": 1,
        "name": f"fidelity-{method}",
        "method": method,
        "model": {"arch": "mlp", "config": {"hidden": [256, 256], "dropout": 0.1}},
        "data": {"kind": "npz", "train": str(train), "valid": str(valid)},
        "compression": {
            "layers": ["hidden.1"],
            "max_rank": 64,
            "d": 2,
            "shrink_every": 25,
            "max_metric_drop": TOLERANCE,
        },
        "schedule": [
            {
                "kind": "early",
                "steps": steps,
                "lr": LR,
                "lr_schedule": LR_SCHEDULE,
                **({"gamma": "auto", "target_ratio": EARLY_TARGET} if method == "comera" else {}),
            }
        ],
        "training": {"batch_size": BATCH, "seed": seed, "log_every": 50},
    }


def late_job(base: dict[str, Any], target: float) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out["name"] = f"fidelity-late-{target:g}"
    out["schedule"] += [
        {"kind": "late", "steps": LATE_STEPS, "target_ratio": target, "lr": LR},
        {
            "kind": "finetune",
            "steps": FINETUNE_STEPS,
            "lr": {"cores": 0.001, "others": 5e-4},
            "lr_schedule": "cosine",
        },
    ]
    return out


def summarize(result: Any, seconds: float) -> dict[str, Any]:
    rep = result.report
    last = rep["stages"][-1]
    row: dict[str, Any] = {
        "accuracy": last["metrics"].get("accuracy"),
        "seconds": round(seconds, 2),
        "chance": (rep.get("chance") or {}).get("at_chance"),
    }
    if "compression" in rep:
        comp = rep["compression"]
        row.update(ratio=comp["tensorized_ratio"], size=comp["tensorized_params"])
        row["ranks"] = {k: v["active_ranks"] for k, v in rep["ranks"].items()}
    late = [s for s in rep["stages"] if s["kind"] == "late"]
    if late:
        st = late[-1]
        row.update(
            stage_start_accuracy=rep["stages"][0]["metrics"].get("accuracy"),
            late_accuracy=st["metrics"].get("accuracy"),
            size_start=st["size_start"],
            size_target=st["size_ref"],
            size_end=st["size_end"],
            target_reached=st.get("target_reached"),
            reason=st.get("reason"),
        )
    early = rep["stages"][0]
    if early.get("size_start") is not None:
        row.update(early_size_start=early["size_start"], early_size_end=early["size_end"])
    if early.get("size_ref") is not None:
        row["early_target_reached"] = early.get("target_reached")
    return row


def run_split(name: str, rep: int, tmp: Path, x: Any, y: Any) -> dict[str, dict[str, Any]]:
    train, valid, info = fidelity_data.split(name, x, y, rep, tmp / "data")
    steps = early_steps(info["train"])
    rows: dict[str, dict[str, Any]] = {}
    for method in ("dense", "comera"):
        t0 = time.perf_counter()
        work = tmp / f"{name}-{rep}-{method}"
        result = Trainer(
            JobConfig.from_dict(job(train, valid, method, rep, steps)), workdir=work
        ).run()
        rows["dense" if method == "dense" else "early"] = summarize(
            result, time.perf_counter() - t0
        )
    early_ckpt = tmp / f"{name}-{rep}-comera" / "checkpoints" / "final.safetensors"
    for target in TARGETS:
        t0 = time.perf_counter()
        spec = late_job(job(train, valid, "comera", rep, steps), target)
        work = tmp / f"{name}-{rep}-late-{target:g}"
        result = Trainer(JobConfig.from_dict(spec), workdir=work, resume=early_ckpt).run()
        rows[f"late-{target:g}"] = summarize(result, time.perf_counter() - t0)
    rows["split"] = {**info, "early_steps": steps}
    return rows


def aggregate(splits: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for run in ("dense", "early", *(f"late-{t:g}" for t in TARGETS)):
        rows = [s[run] for s in splits]
        acc = [r["accuracy"] for r in rows]
        agg: dict[str, Any] = {
            "accuracy": statistics.fmean(acc),
            "accuracy_per_split": acc,
            "seconds": round(sum(r["seconds"] for r in rows), 2),
            "at_chance": any(r.get("chance") for r in rows),
        }
        if "ratio" in rows[0]:
            agg["ratio"] = statistics.fmean(r["ratio"] for r in rows if r["ratio"])
            agg["ratio_per_split"] = [r["ratio"] for r in rows]
        if "target_reached" in rows[0]:
            agg["target_reached"] = [r["target_reached"] for r in rows]
            agg["reasons"] = [r["reason"] for r in rows]
            agg["stage_start_accuracy"] = statistics.fmean(r["stage_start_accuracy"] for r in rows)
        out[run] = agg
    return out


def checks(name: str, agg: dict[str, dict[str, Any]], splits: list) -> dict[str, bool]:
    """The acceptance checks for one data set (means over splits; per run for the guard)."""
    tol = TOLERANCE / 100
    early = agg["early"]
    out = {
        "early_within_tolerance_of_dense": early["accuracy"] >= agg["dense"]["accuracy"] - tol,
        "early_at_least_10x": early["ratio"] >= 10.0,
        "early_turned_gates_off": all(
            s["early"]["early_size_end"] < s["early"]["early_size_start"] for s in splits
        ),
    }
    for t in TARGETS:
        for s in splits:
            r = s[f"late-{t:g}"]
            ok_late = r["late_accuracy"] >= r["stage_start_accuracy"] - tol - 1e-9
            ok_target = r["target_reached"] or r["reason"] is not None
            out.setdefault(f"late-{t:g}_within_tolerance", True)
            out[f"late-{t:g}_within_tolerance"] &= bool(ok_late and ok_target)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reps", type=int, default=fidelity_data.FOLDS, help="folds run per data set (<= 5)"
    )
    parser.add_argument("--datasets", default=",".join(fidelity_data.DATASETS))
    parser.add_argument("--skip-encoder", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, MLP runs")
    parser.add_argument("--jobs", type=int, default=2, help="MLP splits run side by side")
    parser.add_argument("--encoder-threads", type=int, default=2, help="torch threads, MiniLM")
    parser.add_argument("--out", default=None)
    parser.add_argument("--early-steps", type=int, default=EARLY_STEPS)
    parser.add_argument("--lr-schedule", default=LR_SCHEDULE, choices=("constant", "cosine"))
    args = parser.parse_args()
    _set_protocol(args.early_steps, args.lr_schedule)
    torch.set_num_threads(args.threads)
    t_all = time.perf_counter()
    results: dict[str, Any] = {}
    with TemporaryDirectory() as tmp:
        names = args.datasets.split(",")
        loaded = {name: fidelity_data.load(name) for name in names}
        work = [
            (name, rep, Path(tmp), *loaded[name][:2]) for name in names for rep in range(args.reps)
        ]
        done = dict(zip(((w[0], w[1]) for w in work), run_splits(work, args), strict=True))
        for name in names:
            x, y, info = loaded[name]
            splits = [done[name, rep] for rep in range(args.reps)]
            agg = aggregate(splits)
            results[name] = {
                "info": {
                    **info,
                    "rows": int(len(y)),
                    "n_classes": len(set(y.tolist())),
                    **splits[0]["split"],
                },
                "runs": agg,
                "splits": splits,
                "checks": checks(name, agg, splits),
                # the runs' own times (the splits may run side by side: --jobs)
                "seconds": round(sum(r["seconds"] for r in agg.values()), 1),
            }
            print_dataset(name, results[name])
    encoder = None
    if not args.skip_encoder:
        encoder = fidelity_encoder.run(threads=args.encoder_threads)
        fidelity_encoder.print_table(encoder)
        torch.set_num_threads(args.threads)
    payload = {
        "benchmark": "fidelity",
        "machine": machine_info(),
        "protocol": {
            "reps": args.reps,
            "jobs": args.jobs,
            "early_steps": EARLY_STEPS,
            "early_epochs_at_least": EARLY_EPOCHS,
            "late_steps": LATE_STEPS,
            "finetune_steps": FINETUNE_STEPS,
            "early_target": EARLY_TARGET,
            "tolerance_points": TOLERANCE,
            "job": job(Path("TRAIN.npz"), Path("VALID.npz"), "comera", 0, EARLY_STEPS),
        },
        "datasets": results,
        "encoder": encoder,
        "seconds": round(time.perf_counter() - t_all, 1),
    }
    if args.out:
        Path(args.out).write_text(__import__("json").dumps(payload, indent=2) + "\n")
    else:
        write_json("fidelity", payload)
    print_markdown(payload)


def run_splits(work: list[tuple], args: argparse.Namespace) -> list[dict[str, dict[str, Any]]]:
    """:func:`run_split` of every ``(name, rep, tmp, x, y)``, in order; ``args.jobs`` processes
    of ``args.threads`` torch threads each run them side by side (spawned: no forked torch)."""
    if args.jobs <= 1:
        return [run_split(*w) for w in work]
    init = (args.early_steps, args.lr_schedule, args.threads)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_init, initargs=init) as pool:
        return list(pool.map(run_split, *zip(*work, strict=True)))


def _init(early_steps: int, lr_schedule: str, threads: int) -> None:
    _set_protocol(early_steps, lr_schedule)
    torch.set_num_threads(threads)


def _set_protocol(early_steps: int, lr_schedule: str) -> None:
    global EARLY_STEPS, LR_SCHEDULE
    EARLY_STEPS, LR_SCHEDULE = early_steps, lr_schedule


def _reached(run: dict[str, Any]) -> str:
    """``k/n``: the splits whose late stage reached its target."""
    return f"{sum(bool(t) for t in run['target_reached'])}/{len(run['target_reached'])}"


def print_dataset(name: str, res: dict[str, Any]) -> None:
    print(f"\n{name} ({res['info']['rows']} rows, {res['seconds']:.0f} s)")  # noqa: T201
    for run, r in res["runs"].items():
        ratio = f"{r['ratio']:6.1f}x" if "ratio" in r else "    1x "
        extra = f" reached {_reached(r)}" if "target_reached" in r else ""
        print(f"  {run:9s} acc {100 * r['accuracy']:6.2f}  {ratio}{extra}")  # noqa: T201
    print("  checks:", res["checks"])  # noqa: T201


def print_markdown(payload: dict[str, Any]) -> None:
    """The table of bench/README.md: one row per data set and run (mean over the splits)."""
    job = payload["protocol"]["job"]
    hidden = job["model"]["config"]["hidden"]
    batch = job["training"]["batch_size"]
    lines = [
        "| data set (rows x features, classes) | model, batch | run | accuracy | "
        "tensorized layer | target reached |",
        "|---|---|---|---|---|---|",
    ]
    for name, res in payload["datasets"].items():
        info = res["info"]
        shape = f"{name} ({info['rows']} x {info['features']}, {info['n_classes']})"
        for run, r in res["runs"].items():
            ratio = f"{r['ratio']:.1f}x" if "ratio" in r else "dense"
            reached = _reached(r) if "target_reached" in r else "-"
            lines.append(
                f"| {shape} | MLP {hidden}, {batch} | {run} | {100 * r['accuracy']:.2f}% | "
                f"{ratio} | {reached} |"
            )
    enc = payload.get("encoder")
    if enc:
        p = enc["points"][0]
        steps, batch = p["steps"], enc["recipe"]["training"]["batch_size"]
        for kind, cos in (("plain SVD", p["svd"]["cosine"]), ("recipe", p["cosine"])):
            ratio = p["svd"]["ratio_encoder_linears"] if kind == "plain SVD" else None
            ratio = ratio or p["ratio_encoder_linears"]
            lines.append(
                f"| MiniLM, stdlib docstrings ({p['data']['n_train']} train) | all-MiniLM-L6-v2, "
                f"{batch} | {kind} ({steps if kind == 'recipe' else 0} steps) | cosine "
                f"{cos['held_out']:.3f} held out, {cos['reference']:.3f} Language Reference | "
                f"{ratio:.2f}x (36 linears) | - |"
            )
    print("\n".join(lines))  # noqa: T201


if __name__ == "__main__":
    main()
