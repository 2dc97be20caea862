"""TTM embedding lookup benchmark: optimized vs no-dedup vs naive vs ``nn.Embedding`` (CPU).

Run ``python -m bench.ttm_embedding``. The MNLI word embedding (docs/method.md#paper-shapes): 30522
x 768, rows padded to 32000 = 16*20*10*10, cols 4*4*8*6, rank 32, float32; ids (32, 128) drawn from
a bounded Zipf law p(k) ~ 1/k^1.1 over the vocabulary (rank k -> a fixed random token id).

* Time: median forward+backward of each variant, measured round-robin in one process, with a
  fixed upstream gradient and gradients set to None every iteration.
* Memory: each variant runs in its own subprocess (``--child VARIANT``), which reports its peak
  RSS; the peak of an idle child is subtracted. Every child, the idle one included, builds the
  same inputs and first runs a tiny forward+backward of all variants (:func:`warm_up`), so the
  one-off runtime memory (OpenMP threads, malloc arenas, code pages: ~45 MiB here) cancels.
  The peak is read from ``VmHWM`` in ``/proc/self/status``: ``ru_maxrss`` of a child survives
  ``exec`` from the parent (Linux keeps the old mm's high-water mark), so it reads at least
  the parent's peak.
* Triton vs torch (``triton_vs_torch`` in the JSON): the optimized lookup on CUDA with
  ``kernel=TORCH`` and ``kernel=TRITON`` (same module, ids and upstream gradient), median
  forward+backward each, synchronized, interleaved; the largest relative difference of the
  outputs and gradients is recorded with the times. Without CUDA it records
  ``"skipped: no CUDA"``. ``--triton-only`` runs just this column and writes
  ``ttm_embedding_triton.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch
from torch import nn

from bench.common import interleaved_medians, machine_info, write_json
from engine.kernels.backend import triton_unavailable_reason
from engine.nn.ttm_embedding import TTMEmbedding
from engine.nn.ttm_naive import ttm_lookup_naive

VOCAB, DIM = 30522, 768
ROW_MODES, COL_MODES, RANK = (16, 20, 10, 10), (4, 4, 8, 6), 32
BATCH, SEQ, ZIPF_S, SEED = 32, 128, 1.1, 0
VARIANTS = ("optimized", "nodedup", "naive", "dense")


def make_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Zipf ids (B, S) and the fixed upstream gradient (B, S, D)."""
    g = torch.Generator().manual_seed(SEED)
    ranks = torch.arange(1, VOCAB + 1, dtype=torch.float64)  # (V,)
    probs = ranks.pow(-ZIPF_S)  # (V,) unnormalized bounded Zipf
    rank_ids = torch.multinomial(probs, BATCH * SEQ, replacement=True, generator=g)  # (B S,)
    token_of_rank = torch.randperm(VOCAB, generator=g)  # (V,)
    ids = token_of_rank[rank_ids].view(BATCH, SEQ)  # (B, S)
    grad = torch.randn(BATCH, SEQ, DIM, generator=g)  # (B, S, D)
    return ids, grad


def make_step(variant: str, ids: torch.Tensor, grad: torch.Tensor):
    """A closure running one forward+backward of ``variant`` (grads reset to None)."""
    torch.manual_seed(SEED)
    if variant == "dense":
        mod: nn.Module = nn.Embedding(VOCAB, DIM)
        fwd = mod
    else:
        mod = TTMEmbedding(
            VOCAB,
            DIM,
            row_modes=ROW_MODES,
            col_modes=COL_MODES,
            max_rank=RANK,
            dedup=variant != "nodedup",
        )
        if variant == "naive":
            m = mod

            def fwd(x):
                return ttm_lookup_naive(x, list(m.cores), list(m.gates), m.gate_threshold)
        else:
            fwd = mod

    def step() -> None:
        mod.zero_grad(set_to_none=True)
        out = fwd(ids)  # (B, S, D)
        out.backward(grad)

    return step


def warm_up() -> None:
    """Tiny forward+backward of every variant: thread pools, kernels, arenas and the modules
    that ``backward(grad)`` imports lazily (sympy, ~33 MiB) all start here."""
    ids = torch.arange(64) % 100  # (64,)
    tiny = TTMEmbedding(120, 24, row_modes=(2, 3, 4, 5), col_modes=(1, 2, 3, 4), max_rank=4)
    outs = [tiny(ids)]  # (64, 24)
    tiny.dedup = False
    outs.append(tiny(ids))  # (64, 24)
    outs.append(ttm_lookup_naive(ids, list(tiny.cores), list(tiny.gates), tiny.gate_threshold))
    outs.append(nn.Embedding(100, 8)(ids))  # (64, 8)
    for out in outs:
        out.backward(torch.ones_like(out))


def child(variant: str) -> None:
    ids, grad = make_inputs()
    warm_up()
    if variant != "idle":
        step = make_step(variant, ids, grad)
        for _ in range(3):
            step()
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"vmhwm_kb": hwm, "ru_maxrss_kb": maxrss}))


def peak_memory() -> dict[str, dict[str, float]]:
    """Peak RSS (MiB) of each variant's child minus the idle child's."""
    raw = {}
    for variant in ("idle", *VARIANTS):
        cmd = [sys.executable, "-m", "bench.ttm_embedding", "--child", variant]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        raw[variant] = json.loads(res.stdout.strip().splitlines()[-1])
    idle = raw["idle"]["vmhwm_kb"]
    out: dict[str, dict[str, float]] = {v: dict(r) for v, r in raw.items()}  # KiB, per child
    for v in VARIANTS:
        out[v]["peak_mib"] = (raw[v]["vmhwm_kb"] - idle) / 1024
    return out


def timings(repeats: int = 20) -> dict[str, float]:
    """Median seconds per forward+backward, variants interleaved round by round."""
    ids, grad = make_inputs()
    return interleaved_medians({v: make_step(v, ids, grad) for v in VARIANTS}, repeats)


def triton_vs_torch(repeats: int = 20) -> dict:
    """The optimized lookup on CUDA, ``kernel=TORCH`` against ``kernel=TRITON`` (module doc)."""
    if not torch.cuda.is_available():
        return {"status": "skipped: no CUDA"}
    reason = triton_unavailable_reason([torch.empty(1, device="cuda")])
    if reason is not None:
        return {"status": f"skipped: {reason}"}
    ids, grad = (t.cuda() for t in make_inputs())  # (B, S), (B, S, D)
    torch.manual_seed(SEED)
    mod = TTMEmbedding(VOCAB, DIM, row_modes=ROW_MODES, col_modes=COL_MODES, max_rank=RANK).cuda()

    def run(kernel: str) -> list[torch.Tensor]:
        mod.kernel = kernel
        mod.zero_grad(set_to_none=True)
        out = mod(ids)  # (B, S, D)
        out.backward(grad)
        torch.cuda.synchronize()
        return [out.detach(), *(p.grad for p in mod.parameters())]

    ref, got = run("torch"), run("triton")  # also compiles the kernels
    diff = max(
        float((g - r).abs().max() / r.abs().max().clamp_min(1e-30))
        for g, r in zip(got, ref, strict=True)
    )
    times = interleaved_medians({k: lambda k=k: run(k) for k in ("torch", "triton")}, repeats)
    return {
        "status": "ran",
        "device": torch.cuda.get_device_name(),
        "dtype": "float32",
        "median_ms": {k: v * 1e3 for k, v in times.items()},
        "torch_over_triton_time": times["torch"] / times["triton"],
        "max_rel_diff_outputs_and_grads": diff,
    }


def _triton_line(col: dict) -> str:
    if col["status"] != "ran":
        return f"triton vs torch: {col['status']}"
    ms = col["median_ms"]
    return (
        f"triton vs torch (CUDA): torch {ms['torch']:.3f} ms, triton {ms['triton']:.3f} ms, "
        f"ratio {col['torch_over_triton_time']:.2f}"
    )


def main() -> None:
    memory = peak_memory()  # first, while this process is still small
    times = timings()
    triton_col = triton_vs_torch()
    ids, _ = make_inputs()
    mem = {v: memory[v]["peak_mib"] for v in VARIANTS}
    ratios = {
        "naive_over_optimized_time": times["naive"] / times["optimized"],
        "dense_over_optimized_time": times["dense"] / times["optimized"],
        "optimized_over_naive_memory": mem["optimized"] / mem["naive"],
    }
    result = {
        "machine": machine_info(),
        "shapes": {
            "num_embeddings": VOCAB,
            "embedding_dim": DIM,
            "row_modes": ROW_MODES,
            "col_modes": COL_MODES,
            "rank": RANK,
            "ids": [BATCH, SEQ],
            "zipf_s": ZIPF_S,
            "unique_ids": int(torch.unique(ids).numel()),
            "dtype": "float32",
        },
        "variants": {v: {"median_ms": times[v] * 1e3, "peak_mib": mem[v]} for v in VARIANTS},
        "memory_raw": memory,
        "load_avg_1_5_15": os.getloadavg(),  # other work on the machine skews the times
        "memory_baseline": "idle child: same imports, inputs (ids, upstream grad) and warm_up()",
        "ratios": ratios,
        "triton_vs_torch": triton_col,
        "targets": {
            "naive_over_optimized_time": ">= 28",
            "dense_over_optimized_time": ">= 2",
            "optimized_over_naive_memory": "<= 0.2",
        },
    }
    path = write_json("ttm_embedding", result)
    lines = [f"{'variant':<10} {'median ms':>10} {'peak MiB':>10}"]
    lines += [f"{v:<10} {times[v] * 1e3:>10.2f} {mem[v]:>10.1f}" for v in VARIANTS]
    lines += [f"{k}: {v:.2f}" for k, v in ratios.items()]
    lines.append(_triton_line(triton_col))
    lines.append(f"unique ids: {result['shapes']['unique_ids']} of {BATCH * SEQ}; -> {path}")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("idle", *VARIANTS))
    parser.add_argument("--triton-only", action="store_true", help="only the Triton column")
    args = parser.parse_args()
    if args.child:
        child(args.child)
    elif args.triton_only:
        col = triton_vs_torch()
        path = write_json("ttm_embedding_triton", {"machine": machine_info(), **col})
        sys.stdout.write(f"{_triton_line(col)} -> {path}\n")
    else:
        main()
