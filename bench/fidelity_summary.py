"""What :mod:`bench.fidelity` makes of its runs: the means over the folds, the acceptance
checks per data set and layer set, the ablation (what the stage-start teacher and the
backing-off guard each add), and the tables it prints (those of bench/README.md).

Pure functions of the runs' summaries: no training here.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from bench import fidelity_data

__all__ = [
    "ABLATION_TARGETS",
    "MAIN",
    "ROOM",
    "TARGETS",
    "TOLERANCE",
    "VARIANTS",
    "ablation",
    "aggregate",
    "checks",
    "print_dataset",
    "print_markdown",
    "room_shown",
    "summary_checks",
]

TARGETS = (0.8, 0.5, 0.2)
ABLATION_TARGETS = (0.5, 0.2)  # the targets every variant runs at (layer set "all")
TOLERANCE = 1.0  # accuracy points: the guard's max_metric_drop and the checks' tolerance
# variant: (stage-start teacher, backing-off guard)
VARIANTS: dict[str, tuple[bool, bool]] = {
    "full": (True, True),
    "no-teacher": (False, True),
    "no-back-off": (True, False),
    "neither": (False, False),
}
MAIN = "all"  # the layer set of the protocol and its checks
# the 0.2 check counts the folds shown to have >= 4x of room: a model 4x smaller than the late
# stage's start holds its accuracy within the tolerance (room_shown)
ROOM = 4.0


def _ok(r: dict[str, Any], tol: float) -> bool:
    """A late branch ended (late stage and run) within the tolerance of its stage start."""
    floor = r["stage_start_accuracy"] - tol - 1e-9
    return r["late_accuracy"] >= floor and r["accuracy"] >= floor


def _hit(r: dict[str, Any], tol: float) -> bool:
    """A late branch reached its target and ended within the tolerance of its stage start."""
    return bool(r["target_reached"]) and _ok(r, tol)


def aggregate(splits: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    tol = TOLERANCE / 100
    for run in (k for k in splits[0] if k != "split"):
        rows = [s[run] for s in splits]
        acc = [r["accuracy"] for r in rows]
        agg: dict[str, Any] = {
            "accuracy": statistics.fmean(acc),
            "accuracy_per_split": acc,
            "seconds": round(sum(r["seconds"] for r in rows), 2),
            "at_chance": any(r.get("chance") for r in rows),
        }
        if "ratio" in rows[0]:
            agg["ratio"] = statistics.fmean(r["ratio"] for r in rows if r["ratio"])
            agg["ratio_per_split"] = [r["ratio"] for r in rows]
            agg["model_ratio"] = statistics.fmean(r.get("model_ratio") or 1.0 for r in rows)
        if "target_reached" in rows[0]:
            agg["target_reached"] = [r["target_reached"] for r in rows]
            agg["within_tolerance"] = [_ok(r, tol) for r in rows]
            agg["reached_within_tolerance"] = [_hit(r, tol) for r in rows]
            agg["late_ratio"] = statistics.fmean(r["late_ratio"] or 1.0 for r in rows)
            agg["rank_one_room"] = [round(r["rank_one_room"], 1) for r in rows]
            agg["back_offs"] = [r["back_offs"] for r in rows]
            agg["reasons"] = [r["reason"] for r in rows]
            agg["stage_start_accuracy"] = statistics.fmean(r["stage_start_accuracy"] for r in rows)
            agg["late_accuracy"] = statistics.fmean(r["late_accuracy"] for r in rows)
        out[run] = agg
    return out


def _share(n: int, of: int, need: int, folds: int = fidelity_data.FOLDS) -> bool:
    """``n`` of ``of`` folds pass a check asking ``need`` of ``folds`` (scaled when fewer ran)."""
    return of > 0 and n >= math.ceil(need * of / folds)


def room_shown(splits: list, layers: str = MAIN, target: float = 0.2) -> list[bool]:
    """Per fold: whether the early stage left >= :data:`ROOM` x of room, shown by a model of
    that size holding the accuracy within the tolerance of the late stage's start: the room
    probe (``<layers>/room``: the early stage trained directly to 1 / ROOM of its own target,
    :mod:`bench.fidelity`), or the late stage at ``target`` itself (reaching it within the
    tolerance shows the room it used). A fold with neither shows none."""
    tol = TOLERANCE / 100
    out = []
    for s in splits:
        late, probe = s[f"{layers}/late-{target:g}/full"], s.get(f"{layers}/room")
        held = probe is not None and probe["accuracy"] >= late["stage_start_accuracy"] - tol
        out.append(_hit(late, tol) or held)
    return out


def checks(
    name: str, agg: dict[str, dict[str, Any]], splits: list, layers: str = MAIN
) -> dict[str, Any]:
    """The acceptance checks of one data set for one layer set (the full variant; every
    variant for the end-of-run tolerance): early stage against dense, the late stage at 0.5
    reaching S* within the tolerance in >= 4 of 5 folds, at 0.2 in >= 3 of 5 of the folds
    with >= :data:`ROOM` x of room (:func:`room_shown`; ``None``: no such fold), and no late
    run ending more than the tolerance below its stage start."""
    tol = TOLERANCE / 100
    early = agg[f"{layers}/early"]
    out: dict[str, Any] = {
        "early_within_tolerance_of_dense": early["accuracy"] >= agg["dense"]["accuracy"] - tol,
        "early_target_reached": all(
            s[f"{layers}/early"].get("early_target_reached") for s in splits
        ),
        "early_turned_gates_off": all(
            s[f"{layers}/early"]["early_size_end"] < s[f"{layers}/early"]["early_size_start"]
            for s in splits
        ),
    }
    full05, full02 = agg.get(f"{layers}/late-0.5/full"), agg.get(f"{layers}/late-0.2/full")
    if full05 is not None:
        n = sum(full05["reached_within_tolerance"])
        out["late-0.5_reached_within_tolerance_4_of_5"] = _share(n, len(splits), 4)
    if full02 is not None:
        room = room_shown(splits, layers)
        hits = [
            ok for ok, roomy in zip(full02["reached_within_tolerance"], room, strict=True) if roomy
        ]
        out["late-0.2_reached_within_tolerance_3_of_5"] = (
            _share(sum(hits), len(hits), 3) if hits else None
        )
    late = [r for k, r in agg.items() if k.startswith(f"{layers}/late-")]
    out["no_run_ends_below_tolerance"] = all(all(r["within_tolerance"]) for r in late)
    return out


def ablation(results: dict[str, Any], layers: str = MAIN) -> dict[str, Any]:
    """What the teacher and the back-off each add, over the data sets and
    :data:`ABLATION_TARGETS`: folds that reached S* within the tolerance and mean accuracy,
    with the part and without it (the other part on, and off; ``both``: ``full`` against
    ``neither``). A part *adds* when the runs
    with it reach S* within the tolerance in more folds, or in as many at a higher mean
    accuracy."""
    table: dict[str, dict[str, Any]] = {}
    for name, res in results.items():
        for t in ABLATION_TARGETS:
            cells = {}
            for v in VARIANTS:
                r = res["runs"].get(f"{layers}/late-{t:g}/{v}")
                if r is None:
                    continue
                cells[v] = {
                    "reached": sum(r["reached_within_tolerance"]),
                    "folds": len(r["reached_within_tolerance"]),
                    "accuracy": r["accuracy"],
                    "late_ratio": r["late_ratio"],
                    "back_offs": sum(r["back_offs"]),
                }
            if cells:
                table[f"{name}/late-{t:g}"] = cells
    parts = {
        "teacher": (("full", "no-teacher"), ("no-back-off", "neither")),
        "back_off": (("full", "no-back-off"), ("no-teacher", "neither")),
        "both": (("full", "neither"),),  # the text row runs these two only
    }
    summary: dict[str, Any] = {}
    for part, pairs in parts.items():
        with_, without = {"reached": 0, "acc": []}, {"reached": 0, "acc": []}
        for cells in table.values():
            for on, off in pairs:
                if on in cells and off in cells:
                    with_["reached"] += cells[on]["reached"]
                    without["reached"] += cells[off]["reached"]
                    with_["acc"].append(cells[on]["accuracy"])
                    without["acc"].append(cells[off]["accuracy"])
        if not with_["acc"]:
            continue
        acc_on, acc_off = statistics.fmean(with_["acc"]), statistics.fmean(without["acc"])
        summary[part] = {
            "reached_with": with_["reached"],
            "reached_without": without["reached"],
            "accuracy_with": acc_on,
            "accuracy_without": acc_off,
            "adds": with_["reached"] > without["reached"]
            or (with_["reached"] == without["reached"] and acc_on > acc_off),
        }
    return {"layers": layers, "cells": table, "parts": summary}


def summary_checks(results: dict[str, Any], abl: dict[str, Any]) -> dict[str, Any]:
    """The issue's acceptance, over every data set (the protocol's layer set; the text row
    with its own): each data set's checks, and whether each ablated part adds something."""
    out: dict[str, Any] = {}
    for name, res in results.items():
        main = "encoder" if name in fidelity_data.TEXT_DATASETS else MAIN
        for check, ok in res["checks"].get(main, {}).items():
            out[f"{name}:{check}"] = ok
    for kind, a in abl.items():
        for part, s in a["parts"].items():
            out[f"ablation:{kind}:{part}_adds"] = s["adds"]
    return out


def _reached(run: dict[str, Any]) -> str:
    """``k/n``: the folds whose late stage reached its target within the tolerance."""
    hits = run.get("reached_within_tolerance", run["target_reached"])
    return f"{sum(bool(t) for t in hits)}/{len(hits)}"


def print_dataset(name: str, res: dict[str, Any]) -> None:
    print(f"\n{name} ({res['info']['rows']} rows, {res['seconds']:.0f} s)")  # noqa: T201
    for run, r in res["runs"].items():
        ratio = f"{r['ratio']:6.1f}x" if "ratio" in r else "    1x "
        extra = ""
        if "target_reached" in r:
            extra = f" late {r['late_ratio']:5.2f}x reached {_reached(r)}"
            extra += f" back-offs {sum(r['back_offs'])}"
        print(f"  {run:28s} acc {100 * r['accuracy']:6.2f}  {ratio}{extra}")  # noqa: T201
    print("  checks:", res["checks"])  # noqa: T201


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    return f"{100 * r['accuracy']:.2f}%, {r['late_ratio']:.2f}x, {_reached(r)}"


def print_markdown(payload: dict[str, Any]) -> None:
    """The tables of bench/README.md: dense and early per data set and layer set; the late
    stage per target with one column per variant (accuracy, the late stage's own ratio, folds
    that reached S* within the tolerance); the MiniLM pass."""
    lines = [
        "| data set (rows) | layers | dense | early | "
        + " | ".join(f"late {t:g} {v}" for t, v in [(0.8, "full")])
        + " |",
        "|---|---|---|---|---|",
    ]
    late_lines = [
        "| data set | layers | target | " + " | ".join(VARIANTS) + " |",
        "|---|---|---|" + "---|" * len(VARIANTS),
    ]
    for name, res in payload["datasets"].items():
        runs = res["runs"]
        sets = sorted({k.split("/")[0] for k in runs if "/" in k}, key=lambda s: s != MAIN)
        for ls in sets:
            e = runs[f"{ls}/early"]
            lines.append(
                f"| {name} ({res['info']['rows']:,}) | {ls} | "
                f"{100 * runs['dense']['accuracy']:.2f}% | "
                f"{100 * e['accuracy']:.2f}% at {e['ratio']:.1f}x | "
                f"{_cell(runs.get(f'{ls}/late-0.8/full'))} |"
            )
            for t in TARGETS:
                cells = [runs.get(f"{ls}/late-{t:g}/{v}") for v in VARIANTS]
                if t == 0.8 or not any(cells):
                    continue
                late_lines.append(
                    f"| {name} | {ls} | {t:g} | " + " | ".join(_cell(c) for c in cells) + " |"
                )
    print("\n".join(lines + [""] + late_lines))  # noqa: T201
    enc = payload.get("encoder")
    if enc:
        p = enc["points"][0]
        steps, batch = p["steps"], enc["recipe"]["training"]["batch_size"]
        enc_lines = []
        for kind, cos in (("plain SVD", p["svd"]["cosine"]), ("recipe", p["cosine"])):
            ratio = p["svd"]["ratio_encoder_linears"] if kind == "plain SVD" else None
            ratio = ratio or p["ratio_encoder_linears"]
            enc_lines.append(
                f"| MiniLM, stdlib docstrings ({p['data']['n_train']} train) | all-MiniLM-L6-v2, "
                f"{batch} | {kind} ({steps if kind == 'recipe' else 0} steps) | cosine "
                f"{cos['held_out']:.3f} held out, {cos['reference']:.3f} Language Reference | "
                f"{ratio:.2f}x (36 linears) | - |"
            )
        print("\n".join(enc_lines))  # noqa: T201
