"""Calibrate the planner's cost model: fit measured TT-linear step times to the model.

    python -m bench.plan_calibration [--repeats 40]

For several shapes, row counts and every candidate plan, times forward+backward and fits
``time = macs / rate + launches * launch_cost`` (least squares on relative error). Reports the
fitted rate, the launch cost in multiply-adds (``CostWeights.kernel_overhead``), and how much
slower the model's pick is than the best measured plan in each setting. Writes
``bench/results/plan_calibration.json``.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from functools import partial

import numpy as np
import torch

from bench.common import fwd_bwd_step, interleaved_medians, machine_info, write_json
from engine.contract.plan import CostWeights, candidate_plans, plan_cost
from engine.nn.functional import problem_for
from engine.nn.tt_linear import TTLinear

SHAPES = [  # (in, out, in_modes, out_modes, max_rank)
    (768, 768, (12, 8, 8), (8, 8, 12), 30),
    (768, 3072, (12, 8, 8), (12, 16, 16), 30),
    (3072, 768, (16, 16, 12), (8, 8, 12), 30),
    (256, 256, (8, 8, 4), (4, 8, 8), 16),
    (64, 96, (8, 8), (8, 12), 16),
]
ROWS = (1, 8, 64, 512)


def measure(repeats: int) -> list[dict]:
    torch.manual_seed(0)
    out = []
    for n, m, in_modes, out_modes, rank in SHAPES:
        layer = TTLinear(n, m, max_rank=rank, in_modes=in_modes, out_modes=out_modes)
        for rows in ROWS:
            x = torch.randn(rows, n, requires_grad=True)
            dy = torch.randn(rows, m)
            problem = problem_for(x, list(layer.cores), layer.bias, layer.meta)

            fns = {
                str(p): fwd_bwd_step(layer, x, dy, setup=partial(setattr, layer, "plan", p))
                for p in candidate_plans()
            }
            times = interleaved_medians(fns, repeats)
            for plan in candidate_plans():
                cost = plan_cost(problem, plan)
                out.append(
                    {
                        "shape": f"{n}x{m}",
                        "rows": rows,
                        "plan": str(plan),
                        "macs": cost.macs,
                        "launches": cost.kernels,
                        "us": times[str(plan)] * 1e6,
                    }
                )
    return out


def fit(samples: list[dict]) -> dict:
    a = np.array([[s["macs"], s["launches"]] for s in samples], dtype=float)
    y = np.array([s["us"] for s in samples])
    w = 1.0 / y
    (us_per_mac, us_per_launch), *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    return {
        "gmacs_per_s": 1e-3 / us_per_mac,
        "us_per_launch": us_per_launch,
        "launch_in_macs": us_per_launch / us_per_mac,
    }


def pick_quality(samples: list[dict], weights: CostWeights) -> dict:
    groups = defaultdict(list)
    for s in samples:
        groups[(s["shape"], s["rows"])].append(s)
    slowdowns = {}
    for key, group in groups.items():
        best = min(group, key=lambda s: s["us"])
        score = lambda s: s["macs"] + weights.kernel_overhead * s["launches"]  # noqa: E731
        pick = min(group, key=score)
        slowdowns[f"{key[0]}@{key[1]}"] = {
            "best": best["plan"],
            "pick": pick["plan"],
            "slowdown": pick["us"] / best["us"],
        }
    values = [v["slowdown"] for v in slowdowns.values()]
    return {
        "mean_slowdown": float(np.mean(values)),
        "max_slowdown": float(np.max(values)),
        "per_setting": slowdowns,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    samples = measure(args.repeats)
    fitted = fit(samples)
    current = pick_quality(samples, CostWeights())
    default = CostWeights().kernel_overhead
    print(
        f"fitted: {fitted['gmacs_per_s']:.1f} GMAC/s, {fitted['us_per_launch']:.1f} us per "
        f"launch = {fitted['launch_in_macs']:.3g} MACs (default {default:.3g})"
    )
    print(
        f"planner picks vs best measured: mean {current['mean_slowdown']:.3f}x, "
        f"worst {current['max_slowdown']:.3f}x"
    )
    path = write_json(
        "plan_calibration",
        {
            "benchmark": "plan_calibration",
            "machine": machine_info(),
            "fit": fitted,
            "default_weights": CostWeights().__dict__,
            "picks": current,
            "samples": samples,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
