"""TTLinear forward+backward against nn.Linear, side by side in one process.

    python -m bench.tt_linear [--repeats 15] [--no-allocator-pass]

Shapes 768->768 and 768->3072 at rank 30 (the MNLI preset's modes), 128 / 1024 / 4096 rows,
float32, input requiring grad, backward driven by a fixed upstream gradient, parameter grads
reset to None each step (as ``zero_grad(set_to_none=True)`` does). Also timed for context:
a plain rank-30 two-GEMM factorization (``Linear(N, 30, bias=False)`` then ``Linear(30, M)``)
and the "ops floor": the fused plan's tensor ops run bare (no gates, no autograd).

Large temporaries (a 4096 x 3072 float32 output is 50 MB) are above glibc's mmap threshold,
so every step pays page faults for fresh memory; that cost is a large share of a
memory-bound TT step and a small one of a compute-bound dense step. The benchmark therefore
runs twice: in this process with the default allocator, and in a child process with glibc
told to keep freed memory (``MALLOC_MMAP_MAX_=0``, ``MALLOC_TRIM_THRESHOLD_`` large), the
effect PyTorch's CPU tuning guide gets from jemalloc/tcmalloc. Both are reported.
Writes ``bench/results/tt_linear.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
from torch import nn

from bench.common import fwd_bwd_step, interleaved_medians, machine_info, write_json
from engine.contract.execute import _first_product, _skinny
from engine.contract.plan import plan_cost, plan_tt_linear
from engine.nn.functional import problem_for
from engine.nn.tt_linear import TTLinear
from engine.tt.chain import merge, merge_backward

SHAPES = {
    "768x768": {
        "in_features": 768,
        "out_features": 768,
        "in_modes": (12, 8, 8),
        "out_modes": (8, 8, 12),
    },
    "768x3072": {
        "in_features": 768,
        "out_features": 3072,
        "in_modes": (12, 8, 8),
        "out_modes": (12, 16, 16),
    },
}
ROWS = (128, 1024, 4096)
RANK = 30
TUNED_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def _raw_ops(tt: TTLinear, x: torch.Tensor, dy: torch.Tensor):
    """The fused plan's tensor ops alone: no gates, no autograd, no Python function.

    A floor for what eager PyTorch can reach with this plan; the gap to it is the cost of
    the gates and of autograd's bookkeeping for the layer's 2d + 2d - 1 + 1 parameters.
    """
    d = len(tt.in_modes)
    cores = [c.detach() for c in tt.cores]
    bias, xd, r = tt.bias.detach(), x.detach(), tt.ranks[d]

    def run() -> None:
        left, saved_l = merge(cores[:d], "ltr")  # (N, r)
        right, saved_r = merge(cores[d:], "rtl")  # (r M, 1)
        right = right.view(r, -1)  # (r, M)
        t1 = _first_product(xd, left, True)  # (B, r + 1)
        t1 @ torch.cat([right, bias[None]])  # (B, M)
        u1 = _skinny(dy, right.T).contiguous()  # (B, r)
        u1 @ left.T  # (B, N)
        drb = t1.T @ dy  # (r + 1, M)
        merge_backward(cores[:d], saved_l, (u1.T @ xd).T, "ltr")
        merge_backward(cores[d:], saved_r, drb[:r], "rtl")

    return run


def measure(repeats: int) -> list[dict]:
    torch.manual_seed(0)
    rows_out = []
    for name, shape in SHAPES.items():
        n, m = shape["in_features"], shape["out_features"]
        tt = TTLinear(n, m, max_rank=RANK, in_modes=shape["in_modes"], out_modes=shape["out_modes"])
        dense = nn.Linear(n, m)
        two_gemm = nn.Sequential(nn.Linear(n, RANK, bias=False), nn.Linear(RANK, m))
        for rows in ROWS:
            x = torch.randn(rows, n, requires_grad=True)
            dy = torch.randn(rows, m)
            inner = max(1, 256 // rows)
            t = interleaved_medians(
                {
                    "dense": fwd_bwd_step(dense, x, dy),
                    "tt": fwd_bwd_step(tt, x, dy),
                    "two_gemm": fwd_bwd_step(two_gemm, x, dy),
                    "tt_ops_floor": _raw_ops(tt, x, dy),
                },
                repeats=repeats,
                inner=inner,
            )
            problem = problem_for(x, list(tt.cores), tt.bias, tt.meta)
            plan = plan_tt_linear(problem)
            tt_macs = plan_cost(problem, plan).macs
            dense_macs = 3 * rows * n * m
            rows_out.append(
                {
                    "shape": name,
                    "rows": rows,
                    "plan": str(plan),
                    "ms": {k: v * 1e3 for k, v in t.items()},
                    "speedup_vs_dense": t["dense"] / t["tt"],
                    "two_gemm_speedup_vs_dense": t["dense"] / t["two_gemm"],
                    "tt_ops_floor_speedup_vs_dense": t["dense"] / t["tt_ops_floor"],
                    "macs": {"dense": dense_macs, "tt": tt_macs},
                    "mac_ratio": dense_macs / tt_macs,
                }
            )
            r = rows_out[-1]
            print(
                f"{name:>9} rows={rows:5d} plan={r['plan']:<8} dense {r['ms']['dense']:8.2f} ms"
                f"  tt {r['ms']['tt']:7.2f} ms  x{r['speedup_vs_dense']:5.2f}"
                f"  (ops floor x{r['tt_ops_floor_speedup_vs_dense']:5.2f},"
                f" two-GEMM x{r['two_gemm_speedup_vs_dense']:5.2f}, MACs x{r['mac_ratio']:.1f})",
                flush=True,
            )
    return rows_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-allocator-pass", action="store_true")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.repeats)))
        return
    print("default allocator:")
    default = measure(args.repeats)
    tuned = None
    if not args.no_allocator_pass:
        print("glibc told to keep freed memory (child process):")
        env = {**os.environ, **TUNED_ENV}
        out = subprocess.run(
            [sys.executable, "-m", "bench.tt_linear", "--child", "--repeats", str(args.repeats)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        tuned = json.loads(out.strip().splitlines()[-1])
        for r in tuned:
            print(f"{r['shape']:>9} rows={r['rows']:5d} x{r['speedup_vs_dense']:5.2f}")
    targets = {
        ("768x3072", 4096): 6.0,
        ("768x768", 4096): 4.0,
        ("768x3072", 128): 6.0,
        ("768x768", 128): 3.5,
    }
    payload = {
        "benchmark": "tt_linear",
        "machine": machine_info(),
        "dtype": "float32",
        "rank": RANK,
        "targets_speedup": {f"{k[0]}@{k[1]}": v for k, v in targets.items()},
        "default_allocator": default,
        "tuned_allocator": tuned,
        "tuned_env": TUNED_ENV,
    }
    path = write_json("tt_linear", payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
