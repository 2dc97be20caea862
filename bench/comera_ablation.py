"""CoMERA ablation on the trainer: dense vs early stage vs late stage at three size targets.

    python -m bench.comera_ablation [--quick] [--threads N] [--workdir DIR] [--out PATH]

Seven training jobs through :class:`engine.train.Trainer`, each timed on its own:

* synthetic sentence pairs (``nli`` generator), a reduced-width encoder classifier
  (d_model 64, 4 heads, d_ff 128, 2 blocks instead of 768 / 12 / 3072 / 6):
  ``nli-dense`` and ``nli-early`` (CoMERA early stage, ``L + gamma R``) for the same number
  of epochs on the same data, tokenizer and validation set; then three branches resumed from
  the early stage's final checkpoint, each a ``late`` stage (achievement scalarization with
  reference point (L*, S* = target x S at the late start), then pruning to S <= S* if the
  objective fell short) at target 0.8, 0.5, 0.2 and a short ``finetune``;
* synthetic Criteo-format clicks (``criteo`` generator), a reduced DLRM (D = 16, bottom 13-64-16,
  top 64-32-1, 26 tables of 10,001 hash buckets): ``dlrm-dense`` and ``dlrm-comera`` (the
  tables as TTM, early stage only), same epochs.

What is tensorized (``compression.layers``): for NLI the word embedding (TTM) and the FFN
linears (TT); the attention projections and the classifier stay dense. On this task every
factorized attention projection we tried (TT at ranks 8 / 16 / 64 with 2 or 3 modes a side,
and plain rank-8 / 16 / 64 products ``A B``) kept the model on the 67% plateau (contradiction
learnt, entailment vs neutral at chance) for 1,200-3,000 steps in 20+ runs, while the dense
model left it after 250-1,300 steps (notes in the JSON). For DLRM the 26 tables (as in the
paper's DLRM experiment; the MLPs are small and stay dense).

Sizes follow :mod:`engine.rank.size`: ``S`` counts the TT / TTM core entries at the active
ranks; compression is ``dense size of the tensorized layers / S`` and, for the whole model,
``(other + dense) / (other + S)`` (:func:`engine.rank.compression_summary`). For a dense run the
"tensorized" layers are the same layers in dense form (ratio 1). For each late branch the JSON
gives S at the late start, S*, S at the end, whether the target was reached or the fidelity
guard stopped the stage (and why), the gradual cuts (:func:`engine.rank.prune_to_target_` at
each prune event) and the share of the late stage's reduction that they made (the rest: gates
the objective drove below the threshold).

Threads: one intra-op thread by default (``--threads``). The models are tiny, so a second thread
buys little, and with other processes on a 2-core machine two OpenMP threads made a step up to
50x slower (spinning workers). The load average is recorded before and after every run.
Writes ``bench/results/comera_ablation.json`` (``--quick``: a smoke run on a fraction of the
data, written to the work directory unless ``--out`` is given).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.ablation_jobs import (
    DLRM_MODEL,
    NLI_DATA,
    NLI_MODEL,
    TARGETS,
    dlrm_jobs,
    nli_jobs,
)
from bench.common import RESULTS, load_avg, machine_info, write_json
from engine.data import DataConfig, build_data
from engine.rank import compression_summary, rank_snapshot
from engine.train import FunctionCallback, JobConfig, Trainer, TrainResult

TOLERANCE = 0.01  # accuracy: the fidelity guard's default max_metric_drop (1 point)
LIMIT_S = 180.0  # every run must finish within 3 minutes on the 2-core machine


# -- one run ----------------------------------------------------------------------------------
def _selected_dense(model: nn.Module, job: JobConfig) -> int:
    """Dense weight entries of the layers CoMERA tensorizes (pattern and ``min_size``)."""
    opts = job.compression.options
    return sum(
        m.weight.numel()
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear | nn.Embedding)
        and opts.selects(n)
        and m.weight.numel() >= opts.min_size
    )


def run(cfg: dict[str, Any], workdir: Path, resume: Path | None = None) -> dict[str, Any]:
    """Train one job; its report, sizes, timing, load and late-stage figures."""
    job = JobConfig.from_dict(cfg)
    lambdas: list[float] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "step" and event.get("kind") == "late" and "lambda" in event:
            lambdas.append(event["lambda"])

    load0, t0 = load_avg(), time.perf_counter()
    trainer = Trainer(job, workdir=workdir, resume=resume, callbacks=[FunctionCallback(on_event)])
    result: TrainResult = trainer.run()
    wall = time.perf_counter() - t0
    report, model = result.report, result.model
    metrics = report["stages"][-1]["metrics"]
    out: dict[str, Any] = {
        "wall_seconds": round(wall, 2),
        "under_limit": wall < LIMIT_S,
        "load_before": load0,
        "load_after": load_avg(),
        "steps": report["steps"],
        "status": result.status,
        "valid_accuracy": metrics.get("accuracy"),
        "valid_loss": metrics.get("loss"),
        "stages": [
            {
                k: s[k]
                for k in (
                    "label",
                    "kind",
                    "steps",
                    "seconds",
                    "metrics",
                    "size_start",
                    "size_end",
                    "size_ref",
                    "loss_ref",
                    "pruned",
                )
            }
            for s in report["stages"]
        ],
        "checkpoint": str(result.checkpoint),
    }
    if job.tensorized:
        c = compression_summary(model)
        out.update(
            size=c["tensorized_params"],
            tensorized_dense=c["tensorized_dense"],
            tensorized_ratio=c["tensorized_ratio"],
            model_params=c["model_params"],
            model_params_dense=c["model_params_dense"],
            model_ratio=c["model_ratio"],
            ranks={k: v["active_ranks"] for k, v in rank_snapshot(model).items()},
        )
    else:
        dense = _selected_dense(model, job)
        total = sum(p.numel() for p in model.parameters())
        out.update(
            size=dense,
            tensorized_dense=dense,
            tensorized_ratio=1.0,
            model_params=total,
            model_params_dense=total,
            model_ratio=1.0,
        )
    late = next((s for s in report["stages"] if s["kind"] == "late"), None)
    if late is not None:
        cuts = [*late.get("prune_events", []), *([late["pruned"]] if late["pruned"] else [])]
        by_prune = sum(c["size_before"] - c["size_after"] for c in cuts)
        cut = late["size_start"] - late["size_end"]
        start_acc = report["stages"][0]["metrics"].get("accuracy")
        end_acc = late["metrics"].get("accuracy")
        out["late"] = {
            "target_ratio": late["size_ref"] / late["size_start"],
            "size_start": late["size_start"],
            "size_target": late["size_ref"],
            "size_end": late["size_end"],
            "met": late["size_end"] <= late["size_ref"],
            "target_reached": late.get("target_reached"),
            "reason": late.get("reason"),
            "within_tolerance": (
                start_acc is None or end_acc is None or end_acc >= start_acc - TOLERANCE - 1e-9
            ),
            "cut_events": len(cuts),
            "pruned_entries": sum(c["entries_pruned"] for c in cuts),
            "pruned_size": by_prune,
            "pruning_share": by_prune / cut if cut else 0.0,
            "loss_ref": late["loss_ref"],
            "accuracy_after_late": late["metrics"].get("accuracy"),
            "lambda_mean": sum(lambdas) / len(lambdas) if lambdas else None,
            "final_size": out["size"],
        }
    print(
        f"  {cfg['name']:<14} {wall:7.1f} s  acc {_pct(out['valid_accuracy'])}  "
        f"S {out['size']:>9,}  x{_num(out['tensorized_ratio'], '.1f')}  load {load0}",
        flush=True,
    )
    return out


def _late_ok(late: dict[str, Any]) -> bool:
    reached = late["met"] and late["target_reached"] is not False
    stopped = late["target_reached"] is False and bool(late["reason"])
    return bool(late["within_tolerance"] and (reached or stopped))


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:6.2f}"


def _num(x: float | None, fmt: str) -> str:
    """``x`` formatted, or ``-`` (a ratio of a model whose every layer was cut is undefined)."""
    return "-" if x is None else format(x, fmt)


# -- NLI tokenizer ----------------------------------------------------------------------------
def train_tokenizer(directory: Path, quick: bool) -> tuple[str, dict[str, Any]]:
    """One WordPiece tokenizer for every NLI job (tokenizers' trainer is not deterministic)."""
    data = dict(NLI_DATA, **({"n_train": 2_000, "n_valid": 500} if quick else {}))
    bundle = build_data(
        DataConfig.from_dict(data), arch="transformer", batch_size=64, seed=0, workdir=directory
    )
    path = directory / "tokenizer.json"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    info = {
        "path": str(path),
        "sha256": digest,
        "vocab_size": bundle.info["vocab_size"],
        "synthetic": bundle.info.get("synthetic"),
    }
    return str(path), info


# -- table ------------------------------------------------------------------------------------
def table(rows: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    print(
        f"{'run':<12} {'acc %':>7} {'loss':>8} {'S':>10} {'x tens.':>8} {'x model':>8} "
        f"{'S*':>9} {'pruned':>7} {'wall s':>7}"
    )
    for label, r in rows:
        late = r.get("late", {})
        row = {
            "run": label,
            "accuracy": r["valid_accuracy"],
            "loss": r["valid_loss"],
            "size": r["size"],
            "tensorized_ratio": r["tensorized_ratio"],
            "model_ratio": r["model_ratio"],
            "size_target": late.get("size_target"),
            "pruned_size": late.get("pruned_size"),
            "wall_seconds": r["wall_seconds"],
        }
        out.append(row)
        star = "" if row["size_target"] is None else f"{row['size_target']:,.0f}"
        pr = "" if row["pruned_size"] is None else f"{row['pruned_size']:,}"
        print(
            f"{label:<12} {_pct(row['accuracy']):>7} {_num(row['loss'], '8.4f'):>8} "
            f"{row['size']:>10,} {_num(row['tensorized_ratio'], '8.1f'):>8} "
            f"{_num(row['model_ratio'], '8.2f'):>8} {star:>9} {pr:>7} "
            f"{row['wall_seconds']:7.1f}"
        )
    return out


# -- main -------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run on a fraction of the data")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--workdir", type=Path, default=None, help="where jobs write (default: tmp)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default: see module doc)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="comera_ablation_"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"work directory {work}; threads {torch.get_num_threads()}; load {load_avg()}", flush=True
    )

    tok_path, tok_info = train_tokenizer(work / "tokenizer", args.quick)
    nli_cfg = nli_jobs(tok_path, args.quick)
    dlrm_cfg = dlrm_jobs(args.quick)
    runs: dict[str, dict[str, Any]] = {}
    print("synthetic NLI:", flush=True)
    runs["nli-dense"] = run(nli_cfg["nli-dense"], work / "nli-dense")
    runs["nli-early"] = run(nli_cfg["nli-early"], work / "nli-early")
    early_ckpt = Path(runs["nli-early"]["checkpoint"])
    for ratio in TARGETS:
        name = f"nli-late-{ratio}"
        runs[name] = run(nli_cfg[name], work / name, resume=early_ckpt)
    print("synthetic Criteo (DLRM):", flush=True)
    for name in dlrm_cfg:
        runs[name] = run(dlrm_cfg[name], work / name)

    print("\nsynthetic NLI (the paper's ablation shape; late rows: final, after the finetune)")
    nli_table = table(
        [("dense", runs["nli-dense"]), ("early", runs["nli-early"])]
        + [(f"late {r}", runs[f"nli-late-{r}"]) for r in TARGETS]
    )
    print("\nsynthetic Criteo, DLRM (tables tensorized)")
    dlrm_table = table([("dense", runs["dlrm-dense"]), ("comera", runs["dlrm-comera"])])

    nd, ne = runs["nli-dense"], runs["nli-early"]
    dd, dc = runs["dlrm-dense"], runs["dlrm-comera"]
    checks = {
        "nli_early_accuracy_within_1pt": ne["valid_accuracy"] >= nd["valid_accuracy"] - 0.01,
        "nli_early_ratio_ge_30": (ne["tensorized_ratio"] or 0) >= 30,
        # the late stage reaches S <= S* within the tolerance of its start, or the fidelity
        # guard stops it within the tolerance and says why
        **{
            f"nli_late_{r}_target_or_guard": _late_ok(runs[f"nli-late-{r}"]["late"])
            for r in TARGETS
        },
        "dlrm_ratio_ge_50": (dc["tensorized_ratio"] or 0) >= 50,
        "dlrm_accuracy_within_0.5pt": dc["valid_accuracy"] >= dd["valid_accuracy"] - 0.005,
        "every_run_under_180s": all(r["under_limit"] for r in runs.values()),
    }
    print("\nchecks:", json.dumps(checks, indent=1))
    payload = {
        "benchmark": "comera_ablation",
        "quick": args.quick,
        "machine": machine_info(),
        "threads": torch.get_num_threads(),
        "load_end": load_avg(),
        "limit_seconds": LIMIT_S,
        "reduced_width": {"nli": NLI_MODEL["config"], "dlrm": DLRM_MODEL["config"]},
        "nli_tokenizer": tok_info,
        "checks": checks,
        "tables": {"nli": nli_table, "dlrm": dlrm_table},
        "runs": runs,
        "configs": {
            name: JobConfig.from_dict(cfg).to_dict()
            for name, cfg in {**nli_cfg, **dlrm_cfg}.items()
        },
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        path = args.out
    elif args.quick:
        path = work / "comera_ablation_quick.json"
        path.write_text(json.dumps(payload, indent=2) + "\n")
    else:
        path = write_json("comera_ablation", payload)
    print(f"wrote {path} (results dir {RESULTS})")


if __name__ == "__main__":
    main()
