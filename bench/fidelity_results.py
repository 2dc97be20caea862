"""The records of :mod:`bench.fidelity`: one run's row (:func:`summarize`: accuracy, ratios,
the late stage's outcome and every verdict of its guard) and the results file an ``--update``
run merges into (:func:`merge_update`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench import fidelity_data
from bench.common import RESULTS

__all__ = ["merge_update", "previous_results", "smallest_size", "summarize"]


def smallest_size(ranks: dict[str, Any]) -> int:
    """TT core entries of the tensorized layers with every bond at rank 1 (the least the
    late stage's cuts can leave: no MLP layer may be cut to rank 0)."""
    return sum(sum(m for side in v["modes"] for m in side) for v in ranks.values())


def summarize(result: Any, seconds: float) -> dict[str, Any]:
    rep = result.report
    last = rep["stages"][-1]
    row: dict[str, Any] = {
        "accuracy": last["metrics"].get("accuracy"),
        "seconds": round(seconds, 2),
        "chance": (rep.get("chance") or {}).get("at_chance"),
    }
    if "compression" in rep:
        comp = rep["compression"]
        row.update(ratio=comp["tensorized_ratio"], size=comp["tensorized_params"])
        row["model_ratio"] = comp.get("model_ratio")
        row["ranks"] = {k: v["active_ranks"] for k, v in rep["ranks"].items()}
    late = [s for s in rep["stages"] if s["kind"] == "late"]
    if late:
        st = late[-1]
        guard = st.get("guard") if isinstance(st.get("guard"), dict) else {}
        start = guard.get("reference")
        if start is None:
            start = rep["stages"][0]["metrics"].get("accuracy")
        retries = st.get("retries") or []
        reason = st.get("reason")
        if reason and any(r.get("no_back_off") for r in retries):
            reason = reason.split("; a smaller cut")[0] + "; no back-off (ablation): stopped"
        row.update(
            stage_start_accuracy=start,
            late_accuracy=st["metrics"].get("accuracy"),
            size_start=st["size_start"],
            size_target=st["size_ref"],
            size_end=st["size_end"],
            late_ratio=st["size_start"] / st["size_end"] if st["size_end"] else None,
            rank_one_room=st["size_start"] / smallest_size(rep["ranks"]),
            target_reached=st.get("target_reached"),
            stopped=bool(st.get("stopped")),
            back_offs=guard.get("back_offs", 0),
            retries=[
                {
                    k: r.get(k)
                    for k in (
                        "step",
                        "size_before",
                        "size_cut",
                        "size_after",
                        "metric",
                        "floor",
                        "decision",
                    )
                }
                for r in retries
            ],
            reason=reason,
        )
    early = rep["stages"][0]
    if early.get("size_start") is not None:
        row.update(early_size_start=early["size_start"], early_size_end=early["size_end"])
    if early.get("size_ref") is not None:
        row["early_target_reached"] = early.get("target_reached")
    return row


def merge_update(
    payload: dict[str, Any], previous: dict[str, Any], names: list[str], args: Any
) -> None:
    """``--update``: the previous run's protocol with the parts of the data sets run now (the
    MLP's or the text row's), its time plus this run's, and this run listed under
    ``updates``."""
    protocol = {**previous.get("protocol", {})}
    if any(n in fidelity_data.TEXT_DATASETS for n in names):
        protocol.update(  # the text row's protocol of now
            {k: v for k, v in payload["protocol"].items() if k.startswith("text_")},
            text_reps=args.text_reps,
        )
    if any(n not in fidelity_data.TEXT_DATASETS for n in names):  # the MLP protocol of now
        protocol.update(
            {k: v for k, v in payload["protocol"].items() if not k.startswith("text_")},
            reps=args.reps,
        )
    update = {
        "datasets": names,
        "argv": sys.argv[1:],
        "seconds": payload["seconds"],
        "machine": payload["machine"],
    }
    payload.update(
        protocol=protocol,
        machine=previous.get("machine", payload["machine"]),
        note=previous.get("note") if args.note is None else args.note,
        seconds=round(previous.get("seconds", 0.0) + payload["seconds"], 1),
        updates=[*previous.get("updates", []), update],
    )


def previous_results(out: str | None) -> dict[str, Any]:
    path = Path(out) if out else RESULTS / "fidelity.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
