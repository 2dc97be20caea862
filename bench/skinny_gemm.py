"""Skinny-output GEMMs ``x (B, K) @ L (K, r)``: direct, transposed, and at the padded rank.

    python -m bench.skinny_gemm [--repeats 15] [--threads 1,2]

Every fused TT-linear product with a rank-sized output (``x L`` forward, ``dy R^T``
backward, the FFN's ``dh R1^T``) is this shape. The fast path pads the middle bond to
:func:`engine.contract.batched.padded_rank` from 256 rows on; this measures why, side by
side in one process, for B in 128 / 512 / 1024 / 4096 rows, K in 768 / 3072 and r around
the MNLI preset's 30: the direct product ``x @ L``, the transposed one ``(L^T x^T)^T``
(what :func:`engine.contract.execute._skinny` uses below 256 rows), and the direct product
at ``padded_rank(r, B)``. Medians of interleaved rounds, per thread count. Writes
``bench/results/skinny_gemm.json`` with the ratios ``direct / padded`` and
``direct / transposed``.
"""

from __future__ import annotations

import argparse

import torch

from bench.common import interleaved_medians, machine_info, write_json
from engine.contract.batched import padded_rank

ROWS = (128, 512, 1024, 4096)
INNER = (768, 3072)
RANKS = (16, 24, 28, 30, 31, 32, 48)


def measure(rows: int, inner: int, r: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inner, generator=g)  # (B, K)
    left = torch.randn(inner, r, generator=g)  # (K, r)
    rp = padded_rank(r, rows)
    left_p = torch.cat([left, left.new_zeros(inner, rp - r)], dim=1)  # (K, r')
    fns = {
        "direct": lambda: x @ left,
        "transposed": lambda: left.T @ x.T,
        "padded": lambda: x @ left_p,
    }
    ms = {k: v * 1e3 for k, v in interleaved_medians(fns, repeats).items()}
    return {
        "rows": rows,
        "inner": inner,
        "rank": r,
        "padded_rank": rp,
        "ms": ms,
        "direct_over_padded": ms["direct"] / ms["padded"],
        "direct_over_transposed": ms["direct"] / ms["transposed"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    runs = {}
    for t in (int(v) for v in args.threads.split(",")):
        torch.set_num_threads(t)
        rows = [measure(b, k, r, args.repeats) for b in ROWS for k in INNER for r in RANKS]
        runs[str(t)] = rows
        print(
            f"threads {t}: direct / padded at r = 30 (B, K):",
            ", ".join(
                f"({c['rows']}, {c['inner']}) {c['direct_over_padded']:.2f}"
                for c in rows
                if c["rank"] == 30
            ),
            flush=True,
        )
    write_json(
        "skinny_gemm",
        {
            "benchmark": "skinny_gemm",
            "machine": machine_info(),
            "repeats": args.repeats,
            "threads": runs,
        },
    )


if __name__ == "__main__":
    main()
