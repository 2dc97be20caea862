"""The memory plan against the peak RSS of real jobs, every workload.

    python -m bench.memory_plan [--out PATH]

For every workload (transformer, mlm, mlp, dlrm, hf_bert from a tiny BERT directory, hf from a
tiny transformers BERT) one process, and for mlp and hf_bert two (``torchrun``), each job runs
as ``python -m engine.train`` would under the worker, all at once as child processes; each
Python interpreter writes its resident-set high-water mark as it exits
(``tests.helpers.child_peak``). The plan's per-process total (``worker.memory_estimate``,
with this host's baseline as the worker measures it at start, ``worker.process_baseline``)
must be at least each process's peak and at most :data:`MARGIN` above it; ``torchrun``'s
launcher likewise against ``launcher_bytes``. Tiny models: what a process holds here is mostly
the baseline (the interpreter, torch, the engine, the first step's imports).

The suite runs three of these cases (``tests/worker/test_memory_plan_measured.py``); this runs
them all (about a minute of CPU on 2 cores) and writes ``bench/results/memory_plan.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.common import machine_info, write_json
from engine.train.launch import torchrun_command
from tests.helpers.child_peak import ProcessPeak, read_peaks, start_recorded
from tests.helpers.hf_dirs import write_bert_dir
from tests.helpers.hf_models import TEXT, make_model_dir
from tests.helpers.specs import (
    early_stage,
    engine_job,
    late_stage,
    mlm_model,
    mlp_model,
    model_spec,
    synthetic_data,
    text_data,
    transformer_model,
)
from worker.plan import plan_job
from worker.process_baseline import measure_baseline

MARGIN = 1.25  # the estimate is at most this much above the measured peak
SEQ = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "max_len": 16}
WORKLOADS = ("mlp", "transformer", "mlm", "dlrm", "hf_bert", "hf")
TWO_PROCESSES = ("mlp", "hf_bert")


def models(tmp: Path, names: set[str]) -> dict[str, dict[str, Any]]:
    """The model and data of each workload of ``names``; the model directories are written
    only for the workloads that read them."""
    text = tmp / "train.txt"
    text.write_text("\n".join(TEXT) + "\n")
    lines = text_data(text, valid_every=4, max_len=16)
    bert = str(write_bert_dir(tmp / "bert")) if "hf_bert" in names else ""
    hf = str(make_model_dir(tmp / "hf", "bert", "masked_lm")) if "hf" in names else ""
    rows = {"n_train": 256, "n_valid": 32}
    specs = {
        "mlp": {
            "model": mlp_model(64, 64),
            "data": synthetic_data(**rows, params={"shape": [8, 8], "num_classes": 4}),
        },
        "transformer": {
            "model": transformer_model(**SEQ),
            "data": synthetic_data(
                "nli", **rows, max_len=16, vocab_size=100, params={"n_words": 32, "n_topics": 4}
            ),
        },
        "mlm": {
            "model": mlm_model(**SEQ),
            "data": synthetic_data("mlm", **rows, max_len=16, vocab_size=100),
        },
        "dlrm": {
            "model": model_spec(
                "dlrm", {"embedding_dim": 8, "bottom_widths": [16, 8], "top_widths": [16, 8]}
            ),
            "data": synthetic_data("criteo", **rows, num_rows=1000),
        },
        "hf_bert": {
            "model": model_spec(
                "hf_bert", {"path": bert, "distill": "mse_hidden", "calibration_sentences": 16}
            ),
            "data": lines,
        },
        "hf": {"model": model_spec("hf", {"task": "masked_lm", "path": hf}), "data": lines},
    }
    return {name: spec for name, spec in specs.items() if name in names}


def job(model: dict[str, Any], devices: int) -> dict[str, Any]:
    return engine_job(
        version=1,
        name="measured",
        method="comera",
        **copy.deepcopy(model),
        compression={"max_rank": 4, "min_size": 16, "shrink_every": 2},
        schedule=[early_stage(steps=3), late_stage(steps=3, target_ratio=0.7)],
        training={"batch_size": 8, "seed": 0, "devices": devices},
    )


def start(spec: dict[str, Any], directory: Path) -> subprocess.Popen[bytes]:
    """As the worker runs it: ``engine.train`` in one process, or under ``torchrun``."""
    directory.mkdir(parents=True)
    (directory / "job.json").write_text(json.dumps(spec))
    args = ["--config", str(directory / "job.json"), "--out", str(directory / "run")]
    devices = spec["training"]["devices"]
    command = ["-m", "engine.train", *args]
    if devices > 1:
        command = torchrun_command(args, devices)[1:]  # without the interpreter
    return start_recorded(command, directory, env={"OMP_NUM_THREADS": "1"})


def within(estimate: int, peak: ProcessPeak) -> bool:
    return peak.peak_rss <= estimate <= MARGIN * peak.peak_rss


ALL_RUNS = [(name, 1) for name in WORKLOADS] + [(name, 2) for name in TWO_PROCESSES]


def measure(runs: Iterable[tuple[str, int]], tmp: Path) -> list[dict[str, Any]]:
    """Start every ``(workload, processes)`` job of ``runs`` at once, wait for them, and
    return one row per process: the plan's estimate, the measured peak, whether it is
    within [peak, MARGIN x peak]."""
    runs = list(runs)
    specs = models(tmp, {name for name, _ in runs})
    started = {
        (name, devices): start(job(specs[name], devices), tmp / f"{name}-{devices}")
        for name, devices in runs
    }
    baseline = measure_baseline()  # as the worker does at start, beside the jobs
    rows = []
    for (name, devices), proc in started.items():
        directory = tmp / f"{name}-{devices}"
        if proc.wait(timeout=600) != 0:
            raise RuntimeError((directory / "output.log").read_text()[-3000:])
        memory = plan_job(job(specs[name], devices), baseline=baseline)["memory"]
        total = sum(v for k, v in memory.items() if k.endswith("_bytes") and "launcher" not in k)
        peaks = read_peaks(directory)
        ranks = [p for p in peaks if not p.launcher]
        if len(ranks) != devices:
            raise RuntimeError(f"{name} at {devices}: {len(ranks)} rank peaks ({peaks})")
        for peak in peaks:
            estimate = memory["launcher_bytes"] if peak.launcher else total
            rows.append(
                {
                    "workload": name,
                    "processes": devices,
                    "who": "launcher" if peak.launcher else "rank",
                    "estimate_bytes": estimate,
                    "peak_bytes": peak.peak_rss,
                    "ratio": estimate / peak.peak_rss,
                    "within": within(estimate, peak),
                }
            )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"{r['workload']:12} {r['processes']} {r['who']:8} "
        f"estimate {r['estimate_bytes'] / 2**20:7.1f} MB  peak {r['peak_bytes'] / 2**20:7.1f} MB"
        f"  ratio {r['ratio']:.3f}"
        for r in rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(ALL_RUNS, Path(tmp))
    print(table(rows))  # noqa: T201
    payload = {
        "benchmark": "memory_plan",
        "machine": machine_info(),
        "margin": MARGIN,
        "rows": rows,
        "checks": {"every_process_within_the_margin": all(r["within"] for r in rows)},
        "seconds": time.perf_counter() - t0,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    else:
        write_json("memory_plan", payload)


if __name__ == "__main__":
    main()
