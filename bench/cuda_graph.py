"""The training step of the six-encoder MNLI transformer with CUDA graphs on vs off (CUDA only).

    python -m bench.cuda_graph [--batches 1,8] [--rounds N] [--precision fp32|bf16]

The claim (docs/method.md#cuda-graphs): at batch 1 the step is launch-bound, and replaying it as one
CUDA graph makes it at least 2x faster (``cuda_graph_speedup@1`` in ``bench.device_summary``).

A step is the trainer's (:meth:`engine.train.trainer.Trainer._compute` of an ``early``
stage): forward through the workload's ``forward_loss`` inside ``StepExecution.forward()``
(the fast path), objective ``loss + gamma * R`` (``GateIndex(cost_weighted)``, gamma 0.01),
``zero_grad``, backward, the job's AdamW (``engine.train.optim.build_optimizer``, lr 1e-4 /
1e-3 / 5e-5). It runs through :class:`engine.train.execution.StepExecution` with
``TrainingConfig(device="cuda", cuda_graph=<on|off>, fast_path=True, precision=...)``: the
same object the trainer uses, so ``on`` captures the whole step once and replays it. The model
is ``build_transformer(TransformerConfig.mnli(), tensorized=True, max_rank=30,
shapes="mnli")`` in training mode (dropout on), sequence length 128, the inputs of
:mod:`bench.train_step_configs` (fixed seed).

Both modes of a batch size are built from the same seed and live at once; each is warmed up
alone (``on``: its first step captures), with its peak ``max_memory_allocated`` (reset before
its build) minus what was allocated before. Then they are stepped in turns, round-robin:
one untimed step, then ``INNER`` steps between two CUDA events; the median over rounds is
each mode's time per step, and ``speedup = off / on``. The first step of each mode is seeded
alike, so their objectives agree (the captured mode runs its first step eagerly).

Writes ``cuda_graph.json`` (``bench.common.write_json``: ``bench/results``, or
``$COMERA_BENCH_RESULTS``) with the machine info. Without CUDA it writes nothing and exits
with code 2 and a message (``bench/device_check.sh`` and ``bench.device_summary`` read 2 as
"no CUDA"); a capture that fails is recorded and exits 1.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Any

import torch

from bench.train_step_cuda import cuda_timer, require_cuda

INNER = 5  # steps between two CUDA events
GAMMA = 0.01  # the early stage's penalty weight (StageConfig default)
MODES = ("off", "on")
TARGET = 2.0  # speed-up at batch 1
MODEL = (
    "build_transformer(TransformerConfig.mnli(), tensorized=True, max_rank=30, "
    "shapes='mnli'), train mode (dropout on), seq 128"
)


def build(batch: int, mode: str, precision: str, device: torch.device) -> dict[str, Any]:
    """Model, optimizer, execution and one-step callable of one mode (trainer pieces)."""
    from bench.train_step_configs import SEED, make_inputs
    from engine.models.registry import TensorizeOptions, get_workload
    from engine.models.transformer import TransformerConfig, build_transformer
    from engine.rank import GateIndex, early_objective
    from engine.train.config import LearningRates, TrainingConfig
    from engine.train.execution import StepExecution
    from engine.train.optim import build_optimizer

    torch.manual_seed(SEED)
    cfg = TransformerConfig.mnli()
    model = build_transformer(cfg, tensorized=True, max_rank=30, shapes="mnli").to(device)
    model.train()
    optimizer = build_optimizer(model, "comera", LearningRates(), options=TensorizeOptions())
    gates, workload = GateIndex(model, "cost_weighted"), get_workload("transformer")
    ids, types, mask, labels = (t.to(device) for t in make_inputs(batch, cfg))
    inputs = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels}
    training = TrainingConfig(device="cuda", cuda_graph=mode, precision=precision, fast_path=True)
    ex = StepExecution(model, optimizer, device, training, tensorized=True)

    def step_fn(b: Any) -> dict[str, torch.Tensor]:  # Trainer._compute, early stage
        with ex.forward():
            out = workload.forward_loss(model, b)
        objective = early_objective(out.loss, gates.penalty(), GAMMA)  # ()
        optimizer.zero_grad(set_to_none=True)
        objective.backward()
        optimizer.step()
        return {**out.sums, "objective": objective.detach()}

    def step() -> dict[str, torch.Tensor]:  # Trainer._step
        ex.prepare(lambda: workload.forward_loss(model, inputs))
        return ex.run(0, inputs, step_fn)

    return {"model": model, "execution": ex, "step": step, "seed": SEED}


def _free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def measure(
    batch: int, rounds: int, warmup: int, precision: str, device: torch.device
) -> dict[str, Any]:
    runs: dict[str, dict[str, Any]] = {}
    peak: dict[str, float] = {}
    first: dict[str, float] = {}
    for mode in MODES:  # alone: build, first step (seeded alike), warm-up, peak memory
        _free()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run = build(batch, mode, precision, device)
        torch.manual_seed(run["seed"])  # the same dropout masks in both first steps
        first[mode] = float(run["step"]()["objective"])
        for _ in range(warmup):
            run["step"]()
        torch.cuda.synchronize()
        peak[mode] = (torch.cuda.max_memory_allocated() - before) / 2**20
        runs[mode] = run
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(rounds):  # in turns, so clock and thermal drift hit both alike
        for mode in MODES:
            runs[mode]["step"]()
            samples[mode].append(cuda_timer(runs[mode]["step"], INNER))
    ms = {m: statistics.median(v) * 1e3 for m, v in samples.items()}
    execution = {m: runs[m]["execution"].report() for m in MODES}
    runs.clear()
    _free()
    return {
        "batch": batch,
        "step_ms": ms,
        "speedup": ms["off"] / ms["on"],
        "peak_mib": peak,
        "first_step_objective": first,
        "execution": execution,
        "samples_ms": {m: [s * 1e3 for s in v] for m, v in samples.items()},
    }


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1: {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=_sizes, default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds per batch size")
    ap.add_argument("--warmup", type=int, default=3, help="steps per mode before timing")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = ap.parse_args(argv)
    batches = args.batches
    if args.rounds < 1 or args.warmup < 0:
        ap.error("--rounds must be >= 1 and --warmup >= 0")
    device = require_cuda("bench.cuda_graph")

    from bench.common import machine_info, write_json
    from engine.train.cuda_graphs import CudaGraphUnavailableError

    started, rows, status = time.time(), [], "ok"
    for b in batches:
        try:
            rows.append(measure(b, args.rounds, args.warmup, args.precision, device))
        except CudaGraphUnavailableError as err:  # 'on' could not capture this step
            status = f"capture failed at batch {b}: {err}"
            print(status, file=sys.stderr)
            break
        r = rows[-1]
        print(
            f"batch {b:>3}: off {r['step_ms']['off']:.2f} ms, on {r['step_ms']['on']:.2f} "
            f"ms, speed-up {r['speedup']:.2f}x; peak MiB off {r['peak_mib']['off']:.0f}, "
            f"on {r['peak_mib']['on']:.0f}",
            flush=True,
        )
    speedups = {str(r["batch"]): r["speedup"] for r in rows}
    payload = {
        "benchmark": "cuda_graph",
        "status": status,
        "machine": machine_info(),
        "wall_s": time.time() - started,
        "speedup": speedups,
        "target": {"speedup@1": TARGET},
        "settings": {
            "model": MODEL,
            "step": "Trainer._compute of an early stage through StepExecution (fast_path=True, "
            f"precision={args.precision!r}, cuda_graph on | off)",
            "optimizer": "engine.train.optim.build_optimizer('comera'): AdamW, capturable if on",
            "timing": f"CUDA events over {INNER} steps a turn, {args.rounds} turns, median",
            "memory": "max_memory_allocated per mode, reset before its build",
        },
        "results": rows,
    }
    path = write_json("cuda_graph", payload)
    print(f"wrote {path}")
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
