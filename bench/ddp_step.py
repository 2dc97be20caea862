"""One process vs ``devices: N`` data-parallel processes: the same job's time per step.

    python -m bench.ddp_step [--device cuda|cpu] [--devices 2] [--steps 60] [--out PATH]

One small tensorized job (synthetic sentence pairs, encoder d_model 128, 2 blocks, FFN and
word embedding as TT / TTM, batch 64 in all) runs through the engine's command line twice:
as one process, and under torchrun with ``--nproc-per-node N`` (the global batch split N
ways, gradients all-reduced by DistributedDataParallel: nccl on CUDA, gloo on CPU). The time
per step is the median of the logged ``seconds_per_step`` after the first log window (start-up
and the first compilations excluded); both runs' final losses are recorded beside it, since
they must agree (same global batch, same gradient).

On a machine with one GPU (the H200 this project is lent) the N processes share that GPU:
the row is a smoke test of the multi-process path on CUDA (NCCL, the DDP rebuild at each
shrink), not a scaling figure. ``--device cuda`` without CUDA exits 2 ("needs a CUDA
device"), as the other device benchmarks do. Writes ``bench/results/ddp_step.json``
(``COMERA_BENCH_RESULTS`` redirects it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine_info, write_json

NO_CUDA_EXIT = 2


def job_config(device: str, steps: int, log_every: int) -> dict[str, Any]:
    """The benchmark's engine config (small enough for a CPU smoke run)."""
    return {
        "version": 1,
        "name": "ddp-step",
        "method": "comera",
        "model": {
            "arch": "transformer",
            "config": {
                "d_model": 128,
                "n_heads": 4,
                "d_ff": 256,
                "n_layers": 2,
                "max_len": 64,
                "dropout": 0.0,  # dropout draws per process: the two runs would differ
                "attn_dropout": 0.0,
            },
        },
        "data": {
            "kind": "synthetic",
            "generator": "nli",
            "n_train": 4096,
            "n_valid": 128,
            "max_len": 64,
            "vocab_size": 1000,
        },
        "compression": {"max_rank": 16, "layers": ["encoder.*.ffn.*", "embeddings.word"]},
        "schedule": [{"kind": "early", "steps": steps, "gamma": 0.01}],
        "training": {"batch_size": 64, "seed": 0, "device": device, "log_every": log_every},
    }


def run_job(config: Path, out: Path, devices: int, threads: int) -> dict[str, Any]:
    """Run the job (under torchrun when ``devices > 1``); its step times and last loss."""
    cmd = [sys.executable, "-m", "engine.train", "--config", str(config), "--out", str(out)]
    if devices > 1:
        cmd += ["--nproc-per-node", str(devices)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{devices} process(es) exited {proc.returncode}: {proc.stderr[-2000:]}")
    steps = [
        row
        for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if row.get("event") == "step"
    ]
    timed = [r["seconds_per_step"] for r in steps[1:]] or [steps[-1]["seconds_per_step"]]
    return {
        "devices": devices,
        "step_ms_median": round(1e3 * statistics.median(timed), 3),
        "windows": len(timed),
        "final_train_loss": steps[-1]["train_loss"],
        "wall_seconds": round(wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--devices", type=int, default=2, help="processes of the parallel run")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default: results dir)")
    args = ap.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("bench.ddp_step --device cuda needs a CUDA device", file=sys.stderr)
            sys.exit(NO_CUDA_EXIT)
    log_every = max(1, args.steps // 6)
    with tempfile.TemporaryDirectory(prefix="ddp_step_") as tmp:
        config = Path(tmp) / "job.json"
        config.write_text(json.dumps(job_config(args.device, args.steps, log_every)))
        one = run_job(config, Path(tmp) / "one", 1, args.threads)
        many = run_job(config, Path(tmp) / "many", args.devices, args.threads)
    payload = {
        "benchmark": "ddp_step",
        "machine": machine_info(),
        "device": args.device,
        "steps": args.steps,
        "global_batch": 64,
        "one_process": one,
        "data_parallel": many,
        "parallel_over_one_time": round(many["step_ms_median"] / one["step_ms_median"], 3),
        "final_loss_gap": abs(many["final_train_loss"] - one["final_train_loss"]),
    }
    path = write_json("ddp_step", payload) if args.out is None else args.out
    if args.out is not None:
        args.out.write_text(json.dumps(payload, indent=1))
    print(
        f"{args.device}: 1 process {one['step_ms_median']} ms/step, {args.devices} processes "
        f"{many['step_ms_median']} ms/step (x{payload['parallel_over_one_time']}); final "
        f"loss gap {payload['final_loss_gap']:.2e}; wrote {path}"
    )


if __name__ == "__main__":
    main()
