"""``python -m bench.hf_models``: compressed vs original Hugging Face models, per family.

For each family (BERT masked LM, GPT-2, LLaMA and Qwen2 causal LMs), one model of the same
FFN-heavy shape (``--hidden``, ``--ffn`` = 4 x hidden, ``--layers``, vocabulary 512) is built
dense by transformers and tensorized by the ``hf`` workload (every block linear at
``--max-rank``). Measured side by side, calls interleaved:

* training step (forward, backward, AdamW step) at ``--batch`` x ``--seq`` tokens: the dense
  model vs the TT model (the engine's planned contractions);
* inference of the exported ``model/hf/`` directory loaded by transformers
  (``trust_remote_code``) vs the original dense model: batch 1 and batch ``--batch``, at
  ``--seq`` tokens;
* parameters of the tensorized layers, dense and TT.

Writes ``bench/results/hf_models.json``. ``--quick`` runs tiny shapes (the test's version).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.common import interleaved_medians, machine_info, write_json
from engine.export.hf_export import export_hf
from engine.models.hf import HFConfig, build_hf, hf_loss
from engine.models.hf.model import auto_class
from engine.models.tensorize import TensorizeOptions
from engine.nn.tt_linear import TTLinear

__all__ = ["run", "main", "FAMILIES"]

FAMILIES = {
    "bert": "masked_lm",
    "gpt2": "causal_lm",
    "llama": "causal_lm",
    "qwen2": "causal_lm",
}
VOCAB = 512


def config_json(family: str, hidden: int, layers: int, positions: int) -> dict[str, Any]:
    """An FFN-heavy config of ``family``: FFN width 4 x hidden, heads of 64."""
    heads = max(hidden // 64, 1)
    ffn = 4 * hidden
    if family == "gpt2":
        sizes = {"n_embd": hidden, "n_layer": layers, "n_head": heads, "n_positions": positions}
        sizes.update(n_inner=ffn, bos_token_id=2, eos_token_id=3)
    else:
        sizes = {
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "intermediate_size": ffn,
            "max_position_embeddings": positions,
        }
        if family != "bert":
            sizes["num_key_value_heads"] = max(heads // 2, 1)
    return {"model_type": family, "vocab_size": VOCAB, "pad_token_id": 0, **sizes}


def _batch(batch: int, seq: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, VOCAB, (batch, seq), generator=g)  # (B, S)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool)}


def _train_step(model: torch.nn.Module, batch: dict) -> Any:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss, _ = hf_loss(model, batch)
        loss.backward()
        opt.step()

    return step


def _tt_sizes(model: torch.nn.Module) -> dict[str, int]:
    layers = [m for m in model.modules() if isinstance(m, TTLinear)]
    return {
        "layers": len(layers),
        "dense_params": sum(m.dense_parameters() for m in layers),
        "tt_params": sum(m.tt_parameters() for m in layers),
    }


def one_family(family: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    task = FAMILIES[family]
    cfg = HFConfig(
        task=task,
        hf_config=config_json(family, args.hidden, args.layers, args.seq + 2),
        mask_token_id=4,
        pad_token_id=0,
    )
    opts = TensorizeOptions(max_rank=args.max_rank, min_size=1)
    torch.manual_seed(0)
    dense = build_hf(cfg, tensorized=False, options=opts)
    torch.manual_seed(0)
    tt = build_hf(cfg, tensorized=True, options=opts)
    batch = _batch(args.batch, args.seq)
    train = interleaved_medians(
        {"dense": _train_step(dense.train(), batch), "tt": _train_step(tt.train(), batch)},
        repeats=args.repeats,
        warmup=2,
    )
    export_dir = workdir / family
    export_hf(tt.eval(), export_dir, tokenizer=None)
    exported = auto_class(task).from_pretrained(str(export_dir), trust_remote_code=True).eval()
    original = dense.net.eval()
    infer: dict[str, Any] = {}
    for name, b in (("batch_1", 1), ("throughput", args.batch)):
        inputs = {k: v.long() for k, v in _batch(b, args.seq).items()}
        with torch.inference_mode():
            t = interleaved_medians(
                {
                    "original": lambda i=inputs: original(**i),
                    "exported": lambda i=inputs: exported(**i),
                },
                repeats=args.repeats,
                warmup=2,
            )
        infer[name] = {
            "batch": b,
            "original_ms": round(t["original"] * 1e3, 3),
            "exported_ms": round(t["exported"] * 1e3, 3),
            "speedup": round(t["original"] / t["exported"], 3),
        }
    sizes = _tt_sizes(tt)
    return {
        "task": task,
        "config": cfg.config_json,
        "train_step": {
            "dense_ms": round(train["dense"] * 1e3, 3),
            "tt_ms": round(train["tt"] * 1e3, 3),
            "speedup": round(train["dense"] / train["tt"], 3),
        },
        "inference": infer,
        "tensorized": {**sizes, "ratio": round(sizes["dense_params"] / sizes["tt_params"], 2)},
        "parameters": {
            "original": sum(p.numel() for p in original.parameters()),
            "exported": sum(p.numel() for p in exported.parameters()),
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            results[family] = one_family(family, args, Path(tmp))
            r = results[family]
            print(  # noqa: T201
                f"{family:6s} step {r['train_step']['speedup']:.2f}x  inference b1 "
                f"{r['inference']['batch_1']['speedup']:.2f}x  b{args.batch} "
                f"{r['inference']['throughput']['speedup']:.2f}x  layers "
                f"{r['tensorized']['ratio']:.1f}x smaller"
            )
    return {
        "benchmark": "hf_models",
        "shape": {
            "hidden": args.hidden,
            "ffn": 4 * args.hidden,
            "layers": args.layers,
            "vocab": VOCAB,
            "batch": args.batch,
            "seq": args.seq,
            "max_rank": args.max_rank,
        },
        "repeats": args.repeats,
        "machine": machine_info(),
        "families": results,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.hf_models", description=__doc__)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--max-rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--quick", action="store_true", help="tiny shapes, for the test")
    p.add_argument("--out", default="hf_models", help="results file name (no .json)")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.batch, args.seq, args.repeats = 64, 1, 4, 16, 2
    payload = run(args)
    if not args.quick:
        print(write_json(args.out, payload))  # noqa: T201
    return payload


if __name__ == "__main__":
    main()
