"""``python -m bench.lm_pretrain``: a LLaMA-style decoder trained from a config on real English.

Text that installs offline: training sentences are the docstrings of the standard library and
of installed packages (``stdlib_text``, ``source: "docstrings"``); validation sentences are
the Python Language Reference (``source: "reference"``), a source training never sees. A
WordPiece tokenizer of ``--vocab`` tokens is trained on the training sentences.

Three runs of the ``hf`` workload (``python -m engine.train``'s ``run_job``), one sentence a
sequence of at most ``--seq`` tokens, batch ``--batch``:

1. dense: ``method: "dense"`` for ``--steps`` steps;
2. CoMERA: the same model from the same config with every block linear in TT form at
   ``--max-rank``, early stage then a late stage to ``--target-ratio`` of the tensorized size
   and a short finetune, ``--steps`` steps in all (equal tokens);
3. the pretrained path: the dense model of run 1 saved as a Hugging Face directory and
   compressed (TT-SVD at ``--compress-rank``, whitened start, distillation from it) for
   ``--compress-steps`` steps, once with every layer at that rank and once with the same TT
   entries spread by the layers' whitened spectra (``rank_allocation: "energy"``).

Runs 1 and 2 each train once per learning-rate pair of their grid (``--dense-lrs``,
``--comera-lrs``: ``others/cores`` pairs; ``cores`` is the tensorized layers' rate, the TT
cores or, for dense, the same linears' weights) and the one with the lowest validation
perplexity stands for its method: each method at its own best rate, every point of both grids
in the JSON. TT cores want a rate about ten times lower than the dense weights they replace (a
chain of cores multiplies its updates), so one shared rate would favour whichever method it
was tuned for.

Reported: validation perplexity of each (runs 1 and 2 at equal tokens; run 1 at the training
time run 2 took: equal wall time, read from run 1's evaluations), the training step time,
parameters of the tensorized layers (dense and TT), and the perplexity of run 3 before and
after compression. Writes ``bench/results/lm_pretrain.json``. ``--quick``: tiny, for the test.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.common import machine_info, write_json
from engine.data.stdlib_text import StdlibTextParams
from engine.data.text_draw import generate_stdlib_text
from engine.data.tokenizer import train_wordpiece
from engine.export import load_compressed
from engine.train.cli import run_job
from engine.train.job import JobConfig

__all__ = ["main", "run", "config_json"]

PACKAGES = ("torch", "numpy", "sympy", "networkx")
# the learning-rate grids, others/cores (module doc)
DENSE_LRS = "1e-3/5e-4,1e-3/1e-3,2e-3/1e-3,1e-3/2e-3"
COMERA_LRS = "2e-3/1.5e-4,2e-3/3e-4,1e-3/1.5e-4"


def config_json(args: argparse.Namespace) -> dict[str, Any]:
    """The decoder: LLaMA blocks, grouped-query attention, FFN 4 x hidden."""
    heads = max(args.hidden // 64, 2)
    kv = heads // 2 if heads % 2 == 0 else heads  # grouped-query attention needs kv | heads
    return {
        "model_type": "llama",
        "vocab_size": args.vocab,
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": 4 * args.hidden,
        "max_position_embeddings": args.seq,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 3,
    }


def corpus(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Training and validation files and the tokenizer, under ``root``."""
    packages = () if args.quick else PACKAGES
    modules = ("[a-c]*",) if args.quick else ("*",)  # quick: a few files to parse
    params = StdlibTextParams(packages=packages, modules=modules)
    train, info = generate_stdlib_text(args.sentences, 0, params)
    valid, vinfo = generate_stdlib_text(
        args.valid_sentences, 0, StdlibTextParams(source="reference")
    )
    (root / "train.txt").write_text("\n".join(train) + "\n")
    (root / "valid.txt").write_text("\n".join(valid) + "\n")
    tok = train_wordpiece(train, vocab_size=args.vocab, lowercase=True)
    tok.save(str(root / "tokenizer.json"))
    return {
        "train_sentences": len(train),
        "valid_sentences": len(valid),
        "train_source": "docstrings of the standard library"
        + (f" and {list(packages)}" if packages else ""),
        "valid_source": "the Python Language Reference (pydoc_data.topics)",
        "tokenizer_vocab": tok.get_vocab_size(),
        "pools": {"train": info.get("pool_sha256"), "valid": vinfo.get("pool_sha256")},
    }


def _data(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "kind": "text",
        "train": str(root / "train.txt"),
        "valid": str(root / "valid.txt"),
        "max_len": args.seq,
        "length_buckets": 8,
    }


def lr_grid(text: str) -> list[dict[str, float]]:
    """``"others/cores,..."`` -> the stages' ``lr`` objects (gates at 1e-3)."""
    grid = []
    for pair in text.split(","):
        others, cores = (float(v) for v in pair.split("/"))
        grid.append({"cores": cores, "gates": 1e-3, "others": others})
    return grid


def _training(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "batch_size": args.batch,
        "seed": 0,
        "log_every": 10,
        "eval_batches": args.eval_batches,
    }


def _evals(out: Path) -> list[dict[str, Any]]:
    """Every evaluation with the training seconds spent before it (from the step events)."""
    seconds, last_step, rows = 0.0, 0, []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "step":
            seconds += event["seconds_per_step"] * (event["step"] - last_step)
            last_step = event["step"]
        elif event["event"] == "eval":
            rows.append(
                {
                    "step": event["step"],
                    "seconds": round(seconds, 2),
                    "perplexity": event["valid_perplexity"],
                }
            )
    return rows


def _summary(report: dict[str, Any], out: Path) -> dict[str, Any]:
    comp = report.get("compression") or {}
    evals = _evals(out)
    steps = report["steps"]
    train_seconds = sum(s["seconds"] for s in report["stages"])
    return {
        "perplexity": report["stages"][-1]["metrics"]["perplexity"],
        "steps": steps,
        "train_seconds": round(train_seconds, 2),
        "seconds_per_step": round(train_seconds / max(steps, 1), 4),
        "tensorized_layers_dense_params": comp.get("tensorized_dense"),
        "tensorized_layers_params": comp.get("tensorized_params"),
        "model_params": comp.get("model_params") or report.get("parameters"),
        "evals": evals,
    }


def dense_job(args: argparse.Namespace, root: Path, base: dict, lr: dict) -> dict[str, Any]:
    """Run 1 at learning rates ``lr``."""
    stage = {"kind": "early", "steps": args.steps, "eval_every": args.eval_every, "lr": lr}
    return {
        "method": "dense",
        "model": {"arch": "hf", "config": base},
        "data": _data(root, args),
        "schedule": [stage],
        "training": _training(args),
    }


def comera_job(args: argparse.Namespace, root: Path, base: dict, lr: dict) -> dict[str, Any]:
    """Run 2 at learning rates ``lr``: early, late to ``--target-ratio``, finetune."""
    late = args.steps // 4
    early = args.steps - late - args.steps // 10
    return {
        "method": "comera",
        "model": {"arch": "hf", "config": base},
        "data": _data(root, args),
        "compression": {"max_rank": args.max_rank, "min_size": 1024},
        "schedule": [
            {"kind": "early", "steps": early, "eval_every": args.eval_every, "lr": lr},
            {"kind": "late", "steps": late, "target_ratio": args.target_ratio, "lr": lr},
            {"kind": "finetune", "steps": args.steps - early - late, "lr": lr},
        ],
        "training": _training(args),
    }


def _train(root: Path, name: str, job: dict[str, Any]) -> dict[str, Any]:
    report = run_job(JobConfig.from_dict(job), root / name)
    return {"run": name, "lr": job["schedule"][0]["lr"], **_summary(report, root / name)}


def _best(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run of lowest validation perplexity, and every run's rates and perplexity."""
    grid = [{"lr": r["lr"], "perplexity": r["perplexity"]} for r in runs]
    return min(runs, key=lambda r: r["perplexity"]), grid


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        text = corpus(args, root)
        base = {
            "task": "causal_lm",
            "hf_config": config_json(args),
            "tokenizer": str(root / "tokenizer.json"),
        }
        dense, dense_grid = _best(
            [
                _train(root, f"dense-{i}", dense_job(args, root, base, lr))
                for i, lr in enumerate(lr_grid(args.dense_lrs))
            ]
        )
        comera, comera_grid = _best(
            [
                _train(root, f"comera-{i}", comera_job(args, root, base, lr))
                for i, lr in enumerate(lr_grid(args.comera_lrs))
            ]
        )
        within = [e for e in dense["evals"] if e["seconds"] <= comera["train_seconds"]]
        dense["at_comera_wall_time"] = within[-1] if within else None
        compressed = {
            a: compress_dense(root, root / dense["run"], args, a) for a in ("uniform", "energy")
        }
    ratio_tt = dense["tensorized_layers_dense_params"] or comera["tensorized_layers_dense_params"]
    return {
        "benchmark": "lm_pretrain",
        "model": config_json(args),
        "text": text,
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "lr": {"dense": dense["lr"], "comera": comera["lr"]},
        "lr_grid": {"dense": dense_grid, "comera": comera_grid},
        "tokens": args.steps * args.batch * args.seq,
        "machine": machine_info(),
        "dense": dense,
        "comera": comera,
        "ratios": {
            "perplexity_comera_over_dense_equal_tokens": round(
                comera["perplexity"] / dense["perplexity"], 4
            ),
            "perplexity_comera_over_dense_equal_time": round(
                comera["perplexity"] / dense["at_comera_wall_time"]["perplexity"], 4
            )
            if dense["at_comera_wall_time"]
            else None,
            "tensorized_params_dense_over_tt": round(
                ratio_tt / max(comera["tensorized_layers_params"], 1), 2
            ),
            "step_time_dense_over_comera": round(
                dense["seconds_per_step"] / comera["seconds_per_step"], 3
            ),
        },
        "compressed_dense": compressed,
    }


def compress_dense(
    root: Path, dense: Path, args: argparse.Namespace, allocation: str
) -> dict[str, Any]:
    """Run 3: the dense model of run 1 (its output folder ``dense``) as a Hugging Face
    directory, compressed with ``rank_allocation`` ``allocation`` (same TT entries either
    way: ``energy`` spreads them over the layers by their whitened spectra)."""
    directory = root / "dense_hf"
    if not directory.exists():
        model, _ = load_compressed(dense / "model")
        model.net.save_pretrained(directory)
        (directory / "tokenizer.json").write_bytes((root / "tokenizer.json").read_bytes())
    config = {"task": "causal_lm", "path": str(directory), "rank_allocation": allocation}
    job = {
        "model": {"arch": "hf", "config": config},
        "data": _data(root, args),
        "compression": {"max_rank": args.compress_rank, "min_size": 1024},
        "schedule": [{"kind": "finetune", "steps": args.compress_steps}],
        "training": _training(args),
    }
    report = run_job(JobConfig.from_dict(job), root / f"compressed-{allocation}")
    deploy = report["hf_export"]["deploy"]
    comp = report.get("compression") or {}
    start = report["hf_export"].get("preparation") or {}
    ranks = [row["rank"] for row in start.get("layers", []) if "rank" in row]
    return {
        "start": {
            "init": start.get("init"),
            **({"ranks_min_max": [min(ranks), max(ranks)]} if ranks else {}),
            **start.get("allocation", {}),
        },
        "perplexity_before": deploy["original"]["metrics"]["perplexity"],
        "perplexity_after": deploy["exported"]["metrics"]["perplexity"],
        "tensorized_ratio": comp["tensorized_ratio"],
        "steps": args.compress_steps,
        "max_rank": args.compress_rank,
        "deploy_ratios": deploy["ratios"],
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.lm_pretrain", description=__doc__)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=48)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--sentences", type=int, default=30000)
    p.add_argument("--valid-sentences", type=int, default=512)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--max-rank", type=int, default=64)
    p.add_argument("--target-ratio", type=float, default=0.7)
    p.add_argument("--compress-rank", type=int, default=24)
    p.add_argument("--compress-steps", type=int, default=100)
    p.add_argument("--dense-lrs", default=DENSE_LRS, help="run 1's grid: others/cores,...")
    p.add_argument("--comera-lrs", default=COMERA_LRS, help="run 2's grid: others/cores,...")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="tiny, for the test")
    p.add_argument("--out", default="lm_pretrain")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.vocab, args.seq, args.batch = 64, 1, 256, 24, 8
        args.steps, args.sentences, args.valid_sentences = 12, 200, 16
        args.eval_every, args.eval_batches, args.max_rank = 5, 2, 4
        args.compress_rank, args.compress_steps = 4, 2
        args.dense_lrs, args.comera_lrs = "1e-3/1e-3,3e-3/3e-3", "2e-3/1.5e-4"
    payload = run(args)
    print(json.dumps(payload["ratios"], indent=1))  # noqa: T201
    if not args.quick:
        print(write_json(args.out, payload))  # noqa: T201
    return payload


if __name__ == "__main__":
    main()
