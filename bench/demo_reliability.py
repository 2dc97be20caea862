"""Does the main demo learn, every time? The job of scripts/demo.sh over ten training seeds.

    python -m bench.demo_reliability [--spec examples/service/nli_job.json] [--seeds 10]
                                     [--threads 1] [--out PATH]

The spec (``JobCreate`` JSON, as ``comera submit`` sends it) is translated to the engine's
job config the way the worker does (:func:`api_schemas.engine_spec.to_engine`) and run through
:class:`engine.train.Trainer` once per ``training.seed`` (the data set stays the same). Per
seed: the validation accuracy after the early stage and at the end, whether the final model is
at chance (the majority class), the tensorized layers' compression, whether the size target
was reached and the wall time. A seed counts as learned when the final accuracy is at least
:data:`LEARNED` and the model is compressed (ratio > 1). Writes
``bench/results/demo_reliability.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch

from api_schemas import JobCreate
from api_schemas.engine_spec import to_engine
from bench.common import machine_info, write_json
from engine.train import JobConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "service" / "nli_job.json"
LEARNED = 0.95  # final validation accuracy of a seed that left the majority-class plateau


def run_seed(spec: dict[str, Any], seed: int, workdir: Path) -> dict[str, Any]:
    body = json.loads(json.dumps(spec))
    body["training"] = {**body.get("training", {}), "seed": seed, "device": "cpu"}
    engine = to_engine(JobCreate.model_validate(body), device="cpu")
    t0 = time.perf_counter()
    result = Trainer(JobConfig.from_dict(engine), workdir=workdir).run()
    stages = result.report["stages"]
    comp = result.report.get("compression") or {}
    target = result.report.get("target") or {}
    final = stages[-1]["metrics"].get("accuracy")
    return {
        "seed": seed,
        "early_accuracy": stages[0]["metrics"].get("accuracy"),
        "final_accuracy": final,
        "at_chance": (result.report.get("chance") or {}).get("at_chance"),
        "tensorized_ratio": comp.get("tensorized_ratio"),
        "model_ratio": comp.get("model_ratio"),
        "target_reached": target.get("target_reached"),
        "learned": bool(
            final is not None and final >= LEARNED and (comp.get("tensorized_ratio") or 0) > 1
        ),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(SPEC))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = json.loads(Path(args.spec).read_text())
    rows = []
    with TemporaryDirectory() as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            rows.append(run_seed(spec, seed, Path(tmp) / f"seed-{seed}"))
            r = rows[-1]
            print(  # noqa: T201
                f"seed {seed}: early {r['early_accuracy']:.4f} final {r['final_accuracy']:.4f} "
                f"x{r['tensorized_ratio'] or 0:.1f} target {r['target_reached']} "
                f"{'learned' if r['learned'] else 'NOT LEARNED'} {r['seconds']:.0f} s",
                flush=True,
            )
    learned = sum(r["learned"] for r in rows)
    payload = {
        "benchmark": "demo_reliability",
        "machine": machine_info(),
        "spec": spec,
        "learned_threshold": LEARNED,
        "learned": learned,
        "seeds": len(rows),
        "rows": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    else:
        write_json("demo_reliability", payload)
    print(f"learned in {learned} of {len(rows)} seeds")  # noqa: T201


if __name__ == "__main__":
    main()
