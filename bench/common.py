"""Shared helpers for the benchmarks: machine info, interleaved timing, JSON output."""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

# ``COMERA_BENCH_RESULTS`` redirects the JSON (bench/device_check.sh writes into its $OUT)
RESULTS = Path(
    os.environ.get("COMERA_BENCH_RESULTS") or Path(__file__).resolve().parent / "results"
)


def machine_info() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
    }


def interleaved_medians(
    fns: dict[str, Callable[[], None]], repeats: int, warmup: int = 3, inner: int = 1
) -> dict[str, float]:
    """Median seconds per call of each fn, timed round-robin so drift hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - start) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}


def fwd_bwd_step(
    module: torch.nn.Module,
    x: torch.Tensor,
    dy: torch.Tensor,
    setup: Callable[[], None] | None = None,
) -> Callable[[], None]:
    """One forward+backward driven by the fixed upstream gradient ``dy``; grads reset to None
    first (as ``zero_grad(set_to_none=True)``), after an optional ``setup``."""
    params = [x, *module.parameters()]

    def run() -> None:
        if setup is not None:
            setup()
        for p in params:
            p.grad = None
        module(x).backward(dy)

    return run


def load_avg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to 0.01 (other work skews timings)."""
    return [round(x, 2) for x in os.getloadavg()]


def map_spawned(
    fn: Callable[..., Any],
    work: list[tuple],
    jobs: int,
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
) -> list[Any]:
    """``fn(*w)`` of every tuple of ``work``, in order: here when ``jobs <= 1``, else in
    ``jobs`` spawned processes side by side (no forked torch), each set up by
    ``initializer(*initargs)``."""
    if jobs <= 1:
        return [fn(*w) for w in work]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        jobs, mp_context=ctx, initializer=initializer, initargs=initargs
    ) as pool:
        return list(pool.map(fn, *zip(*work, strict=True)))


def write_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def galore_adamw() -> type:
    """galore-torch's ``GaLoreAdamW``. Its package also imports the 8-bit variant, which needs
    bitsandbytes (too large to carry to the GPU machine, and unused here): where bitsandbytes is
    missing, a stub stands in for the one base class that import names."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        import sys
        import types

        stub = types.ModuleType("bitsandbytes.optim.optimizer")
        stub.Optimizer2State = type("Optimizer2State", (torch.optim.Optimizer,), {})
        for name in ("bitsandbytes", "bitsandbytes.optim"):
            sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules["bitsandbytes.optim.optimizer"] = stub
    from galore_torch import GaLoreAdamW

    return GaLoreAdamW
