"""One table from what ``bench/device_check.sh`` left in its folder: each step's exit status and
time, then the figures of the benchmark JSON files against the paper's targets.

    python -m bench.device_summary bench/results/device
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# targets from the paper's figures (docs/method.md#sources): per step vs dense and GaLore,
# memory vs GaLore at batch 1,
# the lookup vs naive, CUDA graphs on the batch-1 step
TARGETS = {
    "dense_over_comera_time": 3.0,
    "galore_over_comera_time": 2.0,
    "galore_over_comera_memory@1": 9.0,
    "lookup_vs_naive": 4.0,
    "cuda_graph_speedup@1": 2.0,
}
# exit status of the CUDA-only benchmarks on a machine without CUDA (bench.train_step_cuda)
NO_CUDA_EXIT = 2
CUDA_BENCHES = ("train_step", "cuda_graph", "ddp_step")


def _load(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _flat(prefix: str, value: Any, out: dict[str, float]) -> None:
    """Numbers of a nested JSON value as ``a.b.c`` -> number (for the generic sections)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        out[prefix] = float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)


def _verdict(value: float | None, target: float) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x ({'met' if value >= target else 'MISSED'}, target {target:g}x)"


def _num(value: Any, spec: str) -> str:
    return "-" if not isinstance(value, int | float) else format(value, spec)


def _cuda_graph(data: dict[str, Any]) -> list[str]:
    """The CUDA-graph benchmark: off / on per batch size and the batch-1 verdict."""
    key = "cuda_graph_speedup@1"
    lines = [
        "",
        f"cuda_graph: target {key} >= {TARGETS[key]:g}x  (status: {data.get('status', '?')})",
    ]
    for r in data.get("results", []):
        ms, mib = r.get("step_ms", {}), r.get("peak_mib", {})
        lines.append(
            f"  batch {r.get('batch')}: off {_num(ms.get('off'), '.2f')} ms, on "
            f"{_num(ms.get('on'), '.2f')} ms, speed-up {_num(r.get('speedup'), '.2f')}x;"
            f" peak MiB off {_num(mib.get('off'), '.0f')}, on "
            f"{_num(mib.get('on'), '.0f')}"
        )
    got = (data.get("speedup") or {}).get("1")
    lines.append(f"  {key}: {_verdict(got, TARGETS[key])}")
    return lines


def summary(folder: Path) -> list[str]:
    lines = ["step            exit  seconds"]
    steps = folder / "steps.tsv"
    if steps.exists():
        for row in steps.read_text().splitlines():
            name, rc, secs = row.split("\t")
            note = (
                "  (no CUDA device, or a usage error: see the log)"
                if (rc == str(NO_CUDA_EXIT) and name in CUDA_BENCHES)
                else ""
            )
            lines.append(f"{name:<15} {rc:>4}  {secs:>7}{note}")
    train = _load(folder, "train_step_cuda") or _load(folder, "train_step")
    if train:
        lines.append("")
        lines.append(
            f"{train.get('benchmark', 'train_step')} (ms / peak MiB)  "
            + "  ".join(f"batch {r['batch']}" for r in train.get("results", []))
        )
        for r in train.get("results", []):
            peak = r.get("peak_mib", {})
            cells = ", ".join(
                f"{k} {_num(v, '.1f')}/{_num(peak.get(k), '.0f')}"
                for k, v in r.get("step_ms", {}).items()
            )
            lines.append(f"  batch {r['batch']}: {cells}")
            for name, why in (r.get("failed") or {}).items():
                lines.append(f"    {name} not run: {why}")
            ratios = r.get("ratios", {})
            for key in ("dense_over_comera_time", "galore_over_comera_time"):
                lines.append(f"    {key}: {_verdict(ratios.get(key), TARGETS[key])}")
            if r["batch"] == 1:
                key = "galore_over_comera_memory"
                lines.append(f"    {key}: {_verdict(ratios.get(key), TARGETS[key + '@1'])}")
    ddp = _load(folder, "ddp_step")
    if ddp:
        one, many = ddp["one_process"], ddp["data_parallel"]
        lines.append("")
        lines.append(
            f"ddp_step ({ddp['device']}, global batch {ddp['global_batch']}): 1 process "
            f"{_num(one['step_ms_median'], '.1f')} ms/step, {many['devices']} processes "
            f"{_num(many['step_ms_median'], '.1f')} ms/step (x{ddp['parallel_over_one_time']}), "
            f"final loss gap {ddp['final_loss_gap']:.1e}"
        )
    graphs = _load(folder, "cuda_graph")
    if graphs:
        lines += _cuda_graph(graphs)
    for name, target_key in (
        ("ttm_embedding_triton", "lookup_vs_naive"),
        ("ttm_embedding", "lookup_vs_naive"),
    ):
        data = _load(folder, name)
        if not data:
            continue
        lines.append("")
        lines.append(f"{name}: target {target_key} >= {TARGETS[target_key]:g}x")
        if isinstance(data.get("status"), str):
            lines.append(f"  {data['status']}")
        flat: dict[str, float] = {}
        _flat("", {k: v for k, v in data.items() if k != "machine"}, flat)
        for k, v in list(flat.items())[:40]:
            lines.append(f"  {k}: {v:.4g}")
    return lines


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/device")
    print("\n".join(summary(folder)))


if __name__ == "__main__":
    main()
