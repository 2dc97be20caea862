"""Dense vs CoMERA on the paper's MNLI model: parameter counts and forward+backward time.

    python -m engine.demo [--batch 8 --seq 128 --repeats 3]

Builds the six-encoder MNLI classifier dense and tensorized (TT / TTM, r = 30), prints the
parameter counts of both, then times one forward + backward step (random token ids,
cross-entropy loss) for each: the median of ``--repeats`` runs after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.transformer import (
    TransformerConfig,
    build_transformer,
    parameter_report,
)
from engine.nn.tt_linear import TTLinear


def _step(model: nn.Module, ids: torch.Tensor, types: torch.Tensor, labels: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    logits = model(ids, types, torch.ones_like(ids))  # (B, C)
    F.cross_entropy(logits, labels).backward()


def time_step(
    model: nn.Module,
    cfg: TransformerConfig,
    batch: int,
    seq: int,
    repeats: int,
    device: torch.device,
) -> float:
    """Median seconds of one forward+backward step after one warm-up."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)  # (B, S)
    types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).to(device)  # (B, S)
    labels = torch.randint(0, cfg.num_classes, (batch,), generator=g).to(device)  # (B,)
    model.train()
    _step(model, ids, types, labels)  # warm-up (also fills the contraction-plan cache)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        _step(model, ids, types, labels)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-rank", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = TransformerConfig.mnli()

    dense = build_transformer(cfg, tensorized=False).to(device)
    tt = build_transformer(cfg, tensorized=True, max_rank=args.max_rank).to(device)
    rd, rt = parameter_report(dense), parameter_report(tt)
    enc_tt = sum(
        m.tt_parameters()
        for n, m in tt.named_modules()
        if n.startswith("encoder.") and isinstance(m, TTLinear)
    )
    enc_dense = sum(
        m.dense_parameters()
        for n, m in tt.named_modules()
        if n.startswith("encoder.") and isinstance(m, TTLinear)
    )
    word = tt.embeddings.word

    print(f"MNLI six-encoder classifier, r = {args.max_rank}, device {device}")
    print(f"  dense model            {rd.total:>12,} parameters")
    ratio = rd.total / rt.total
    print(f"  tensorized model       {rt.total:>12,} parameters  ({ratio:.1f}x fewer)")
    print(f"    TT/TTM core entries  {rt.tt_cores:>12,}")
    print(f"    rank-gate entries    {rt.gates:>12,}")
    print(f"    other (dense)        {rt.other:>12,}")
    print(
        f"  tensorized layers ({rt.tensorized_layers}): {rt.tensorized_dense:,} dense weights -> "
        f"{rt.tt_cores:,} core entries ({rt.tensorized_ratio:.1f}x)"
    )
    print(f"  encoder linears: {enc_dense:,} -> {enc_tt:,} ({enc_dense / enc_tt:.1f}x)")
    print(
        f"  word embedding:  {word.dense_parameters():,} -> {word.tt_parameters():,} "
        f"({word.compression_ratio():.1f}x)"
    )

    print(
        f"forward+backward, batch {args.batch} x seq {args.seq}, median of {args.repeats} "
        f"after 1 warm-up, {torch.get_num_threads()} threads:"
    )
    t_dense = time_step(dense, cfg, args.batch, args.seq, args.repeats, device)
    print(f"  dense       {t_dense * 1e3:9.1f} ms")
    t_tt = time_step(tt, cfg, args.batch, args.seq, args.repeats, device)
    print(f"  tensorized  {t_tt * 1e3:9.1f} ms")
    print(f"  speed-up    {t_dense / t_tt:9.2f}x")


if __name__ == "__main__":
    main()
