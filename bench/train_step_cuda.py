"""``python -m bench.train_step --device cuda``: the same configurations on one CUDA device.

    python -m bench.train_step --device cuda [--batches 1,8,32] [--quick] [--repeats N]

The step, model, inputs and optimizers are those of :mod:`bench.train_step_configs` (the CPU
benchmark's), moved to the GPU before the optimizers are built, plus ``comera_graph``: the
``comera`` configuration run through the engine's :class:`engine.train.execution.StepExecution`
with ``cuda_graph="on"`` (the fast path inside, the whole step captured once and replayed).
All configurations of a batch size live in one process (on a GPU the allocator is per device,
and nothing else shares it).

Memory: each configuration is built and stepped alone first (warm-up, and GaLore's SVD
refresh), with ``torch.cuda.reset_peak_memory_stats`` before the build; its peak is
``max_memory_allocated`` minus what was allocated before (the idle models of the others):
weights, gradients, optimizer state and activations of that configuration. Time: then the
configurations are stepped in turns, round-robin (one untimed step, then ``INNER`` steps
between two CUDA events, ``torch.cuda.synchronize`` after); the median over rounds is reported.
GaLore's time per step is ``(199 regular + 1 refresh) / 200`` as on the CPU. A configuration
that fails (out of memory, a capture error) is reported as not run with the reason, and the
others go on. Without CUDA this exits with code 2 and a message.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor

from bench.common import galore_adamw, machine_info, write_json
from bench.train_step_configs import (
    CONFIGS,
    GALORE,
    SEED,
    STEP_SETTINGS,
    Runner,
    _model,
    _runner,
    comera_config,
    make_inputs,
)
from engine.models.transformer import TransformerConfig

__all__ = ["CUDA_CONFIGS", "cuda_timer", "main_cuda", "require_cuda"]

CUDA_CONFIGS = (*CONFIGS, "comera_graph")
INNER = 5  # steps between two CUDA events
NO_CUDA_EXIT = 2  # bench/device_check.sh and bench/device_summary.py read it as "no CUDA"


def require_cuda(what: str) -> torch.device:
    """The CUDA device, or exit with :data:`NO_CUDA_EXIT` and a message saying why not."""
    if not torch.cuda.is_available():
        built = torch.version.cuda or "no CUDA (a CPU-only build)"
        print(
            f"{what}: needs a CUDA device, but torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}, built with {built}); nothing was measured",
            file=sys.stderr,
        )
        sys.exit(NO_CUDA_EXIT)
    return torch.device("cuda")


def cuda_timer(fn: Callable[[], object], n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` calls, between two CUDA events (synchronized)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / n


# -- building the configurations on the GPU -------------------------------------------------
def _graphed(runner: Runner, device: torch.device) -> Callable[[], object]:
    """``comera`` (built without its own fast path) through ``StepExecution(cuda_graph="on")``:
    the fast path comes from the execution, the step is captured on its first call."""
    from engine.train.config import TrainingConfig
    from engine.train.execution import StepExecution

    training = TrainingConfig(device="cuda", cuda_graph="on", fast_path=True)
    ex = StepExecution(runner.model, runner.optimizer, device, training, tensorized=True)
    runner.info["execution"] = ex
    dummy = {"x": torch.zeros(1, device=device)}  # the step reads the bench's fixed inputs

    def step_fn(_: object) -> dict[str, Tensor]:
        with ex.forward():
            loss = runner.loss()
        runner.model.zero_grad(set_to_none=True)
        loss.backward()
        for flat in runner.flats:
            flat.gather_grad_()
        runner.optimizer.step()
        return {"loss": loss.detach()}

    def step() -> object:
        ex.prepare(runner.loss)
        return ex.run("bench", dummy, step_fn)

    return step


def build_cuda(name: str, batch: int, device: torch.device) -> tuple[Runner, Callable[[], object]]:
    """The runner of ``name`` with model and inputs on ``device``, and its one-step callable."""
    torch.manual_seed(SEED)
    base = "comera_eager" if name == "comera_graph" else name  # the execution adds the fast path
    cfg = comera_config(batch) if base.startswith("comera") else TransformerConfig.mnli()
    model = _model(base, cfg, mnli=True).to(device)  # before flatten_ / the optimizer
    model.train()
    inputs = tuple(t.to(device) for t in make_inputs(batch, cfg))
    if name == "galore":
        galore_adamw()  # installs the bitsandbytes stub where it is missing
    runner = _runner(base, model, inputs, GALORE["rank"])
    runner.name = name
    if name == "comera_graph":
        return runner, _graphed(runner, device)
    return runner, runner.step


# -- measuring ------------------------------------------------------------------------------
def _free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def measure_batch_cuda(batch: int, quick: bool, repeats: int | None, device: torch.device) -> dict:
    repeats = repeats or (5 if quick else 15)
    warmup = 2 if quick else 3
    steps: dict[str, Callable[[], object]] = {}
    runners: dict[str, Runner] = {}
    peak: dict[str, float | None] = {}
    failed: dict[str, str] = {}
    refresh_s: list[float] = []
    for name in CUDA_CONFIGS:  # alone: build, warm up, peak memory
        _free()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        try:
            runner, step = build_cuda(name, batch, device)
            for _ in range(warmup):
                step()
            if name == "galore":
                for _ in range(1 if quick else 2):
                    refresh_s.append(cuda_timer(runner.refresh_step, 1))
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001 (OOM, a capture failure: report, go on)
            failed[name] = f"{type(err).__name__}: {str(err)[:300]}"
            peak[name] = None
            runner = step = None  # type: ignore[assignment]
            _free()
            continue
        peak[name] = (torch.cuda.max_memory_allocated() - before) / 2**20
        runners[name], steps[name] = runner, step
    samples: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(repeats):  # in turns, so clock and thermal drift hit all alike
        for name, step in steps.items():
            step()  # the turn starts as a training loop runs
            samples[name].append(cuda_timer(step, INNER))
    med = {k: statistics.median(v) for k, v in samples.items()}
    gap = GALORE["update_proj_gap"]
    if "galore" in med and refresh_s:
        med["galore"] = ((gap - 1) * med["galore"] + statistics.median(refresh_s)) / gap
    step_ms = {k: (med[k] * 1e3 if k in med else None) for k in CUDA_CONFIGS}

    def over(a: dict, x: str, y: str) -> float | None:
        return None if a.get(x) is None or a.get(y) is None else a[x] / a[y]

    ratios = {
        "dense_over_comera_time": over(step_ms, "dense", "comera"),
        "galore_over_comera_time": over(step_ms, "galore", "comera"),
        "galore_over_comera_memory": over(peak, "galore", "comera"),
        "dense_over_comera_memory": over(peak, "dense", "comera"),
        "tltorch_over_comera_time": over(step_ms, "tltorch", "comera"),
        "tltorch_over_comera_memory": over(peak, "tltorch", "comera"),
        "eager_over_fast_path_time": over(step_ms, "comera_eager", "comera"),
        "comera_over_comera_graph_time": over(step_ms, "comera", "comera_graph"),
        "dense_over_comera_graph_time": over(step_ms, "dense", "comera_graph"),
        "galore_over_comera_graph_time": over(step_ms, "galore", "comera_graph"),
    }
    graph = runners.get("comera_graph")
    execution = graph.info.pop("execution").report() if graph is not None else None
    info = {k: {i: v for i, v in r.info.items() if i != "execution"} for k, r in runners.items()}
    runners.clear()
    steps.clear()
    _free()
    return {
        "batch": batch,
        "step_ms": step_ms,
        "peak_mib": peak,
        "ratios": ratios,
        "failed": failed,
        "parameters": {k: i.get("parameters") for k, i in info.items()},
        "comera_graph_execution": execution,
        "galore_refresh_ms": [s * 1e3 for s in refresh_s],
        "rounds": {"warmup": warmup, "timed": repeats, "steps_per_timing": INNER},
        "comera_config": comera_config(batch).to_dict(),
        "samples_ms": {k: [s * 1e3 for s in v] for k, v in samples.items()},
    }


def table_cuda(rows: list[dict]) -> str:
    lines = [f"{'batch':>5} {'config':<13} {'step ms':>9} {'peak MiB':>9}"]
    for r in rows:
        for name in CUDA_CONFIGS:
            ms, mib = r["step_ms"][name], r["peak_mib"][name]
            if ms is None:
                why = r["failed"].get(name, "not run")
                lines.append(f"{r['batch']:>5} {name:<13} not run: {why[:80]}")
                continue
            lines.append(f"{r['batch']:>5} {name:<13} {ms:>9.2f} {mib:>9.1f}")
    lines.append("")
    for r in rows:
        for key, v in r["ratios"].items():
            lines.append(f"{key:<32} batch {r['batch']:>3}: " + ("-" if v is None else f"{v:.2f}"))
    return "\n".join(lines)


def main_cuda(batches: list[int], quick: bool, repeats: int | None) -> None:
    device = require_cuda("bench.train_step --device cuda")
    started = time.time()
    rows = []
    for b in batches:
        rows.append(measure_batch_cuda(b, quick, repeats, device))
        print(table_cuda(rows[-1:]), flush=True)
    payload = {
        "benchmark": "train_step_cuda",
        "machine": machine_info(),
        "wall_s": time.time() - started,
        "quick": quick,
        "settings": {
            **STEP_SETTINGS,
            "configs": "bench.train_step_configs, on the GPU; comera_graph: comera through "
            "StepExecution(cuda_graph='on', fast_path=True)",
            "timing": f"CUDA events over {INNER} steps per turn, turns round-robin, median",
            "memory": "torch.cuda.max_memory_allocated per configuration (reset before its "
            "build, minus what was allocated before)",
        },
        "results": rows,
    }
    path = write_json("train_step_cuda", payload)  # train_step.json stays the CPU result
    print(table_cuda(rows))
    print(f"wrote {path} ({payload['wall_s']:.0f} s)")
