"""One table from what ``bench/device_check.sh`` left in its folder: each step's exit status and
time, then the figures of the benchmark JSON files against the paper's targets.

    python -m bench.device_summary bench/results/device
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# the paper's figures (issue 5): per step vs dense and GaLore, memory vs GaLore at batch 1,
# the lookup vs naive, CUDA graphs on the batch-1 step
TARGETS = {"dense_over_comera_time": 3.0, "galore_over_comera_time": 2.0,
           "galore_over_comera_memory@1": 9.0, "lookup_vs_naive": 4.0,
           "cuda_graph_speedup@1": 2.0}  # fmt: skip


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


def summary(folder: Path) -> list[str]:
    lines = ["step            exit  seconds"]
    steps = folder / "steps.tsv"
    if steps.exists():
        for row in steps.read_text().splitlines():
            name, rc, secs = row.split("\t")
            lines.append(f"{name:<15} {rc:>4}  {secs:>7}")
    train = _load(folder, "train_step")
    if train:
        lines.append("")
        lines.append("train step (ms / peak MiB)  " + "  ".join(
            f"batch {r['batch']}" for r in train.get("results", [])))  # fmt: skip
        for r in train.get("results", []):
            cells = ", ".join(f"{k} {v:.1f}/{r.get('peak_mib', {}).get(k, float('nan')):.0f}"
                              for k, v in r.get("step_ms", {}).items())  # fmt: skip
            lines.append(f"  batch {r['batch']}: {cells}")
            ratios = r.get("ratios", {})
            for key in ("dense_over_comera_time", "galore_over_comera_time"):
                lines.append(f"    {key}: {_verdict(ratios.get(key), TARGETS[key])}")
            if r["batch"] == 1:
                key = "galore_over_comera_memory"
                lines.append(f"    {key}: {_verdict(ratios.get(key), TARGETS[key + '@1'])}")
    for name, target_key in (("ttm_embedding_triton", "lookup_vs_naive"),
                             ("ttm_embedding", "lookup_vs_naive"),
                             ("cuda_graph", "cuda_graph_speedup@1")):  # fmt: skip
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
