"""Are the example jobs' exports bitwise the same at two revisions?

    python -m bench.export_identity --before REV [--after REV] [--jobs a,b] [--shorten]
                                    [--parallel N] [--determinism on-diff|always|never]
                                    [--bisect] [--workdir DIR] [--out PATH] [--keep]

For each revision a throwaway checkout (``git worktree add --detach`` under ``--workdir``, /tmp
by default) runs the engine's example jobs (``examples/engine/*.json`` of that revision) the
way examples/engine/README.md says, ``python -m engine.train --config JOB --out DIR``, with this
interpreter (no install: ``PYTHONPATH`` and the working directory are the checkout, and each
revision's ``import engine`` is checked to resolve inside its checkout). Both revisions run in
the same environment: one intra-op thread (``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1``),
``PYTHONHASHSEED=0``, ``nice -n 10``.

Then every file of the two output directories is compared byte for byte:

* the export (``model/``: the compact checkpoint ``model.safetensors`` and ``manifest.json``,
  ``model/hf/`` and ``model/dense/`` where the job writes them) and a trained tokenizer;
* the run's records (``report.json``, ``metrics.jsonl``, ``ranks.jsonl``) and the training
  checkpoints (``checkpoints/``).

Where bytes differ, a safetensors file is compared tensor by tensor (the raw bytes of each
entry; where they differ, the maximum absolute difference, so a numeric change is told from a
layout change: same tensors in another header order or with other metadata), and a JSON file
(or a safetensors file's JSON metadata) field by field. Fields that legitimately differ between
two runs (wall times, paths of the run, measured latency and memory) are excluded by the
explicit rules of :data:`EXCLUDED`, which the JSON lists, together with every excluded field
that was met and whether its value differed; nothing else is ignored.

A job whose export differs is run a second time at ``--before`` (``--determinism on-diff``, the
default): if the two runs of one revision differ too, the job is not deterministic and the
difference is not the change's. With ``--bisect``, a job that differs while ``--before`` is
deterministic is run at the commits of ``git rev-list --first-parent before..after`` (binary
search) to name the first commit whose export differs from ``--before``'s.

Jobs skipped by default (:data:`bench.identity_runs.SKIPPED`) take more than about two
minutes on the shared 2-core host. ``--shorten`` runs them with the overrides of
:data:`bench.identity_runs.SHORTENED` instead (fewer steps and sentences; the same config at
both revisions, written beside the runs); ``--jobs`` names the
jobs to run. A job's ``result`` is the verdict on its export; the run's records (report,
metrics, training checkpoints) get their own verdict, ``records``, and for a field present at one
revision only, the commits whose change of ``engine/`` names it (``new_or_dropped_fields``).

Runs are kept under ``--workdir`` keyed by commit, job and config digest, and reused: a fixed
``--before`` runs once. Checkouts are removed at the end (``--keep`` keeps them). Writes
``bench/results/export_identity.json`` (``COMERA_BENCH_RESULTS`` or ``--out`` redirect it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import load_avg
from bench.identity_compare import EXCLUDED, compare_dirs
from bench.identity_runs import (
    ENV,
    SHORTENED,
    SKIPPED,
    Checkout,
    Workspace,
    check_import,
    git,
    job_config,
    list_jobs,
    resolve,
    run_job,
    set_path,
)

__all__ = [
    "main",
    "compare_job",
    "bisect_job",
    "field_origins",
    "EXCLUDED",
    "compare_dirs",
    "set_path",
]


# -- the comparison of one job, determinism and bisection ------------------------------------
def bisect_job(
    ws: Workspace,
    job: str,
    before: str,
    after: str,
    reference: Path,
    shorten: bool,
    timeout: float,
) -> dict[str, Any]:
    """First commit of ``before..after`` (first parent) whose export of ``job`` differs."""
    commits = git("rev-list", "--first-parent", "--reverse", f"{before}..{after}").split()
    lo, hi = 0, len(commits) - 1  # commits[hi] differs (it is ``after``)
    probes: list[dict[str, Any]] = []
    while lo < hi:
        mid = (lo + hi) // 2
        co = ws.checkout(commits[mid])
        run = run_job(ws, co, job, shorten, timeout)
        if run["returncode"] != 0:
            probes.append({"sha": commits[mid], "error": f"run failed, see {run['log']}"})
            return {"probes": probes, "first_differing": None, "note": "a probe failed"}
        cmp = compare_dirs(reference, Path(run["out"]))
        same = cmp["export"] != "differs"
        probes.append({"sha": commits[mid], "export": cmp["export"]})
        if same:
            lo = mid + 1
        else:
            hi = mid
    first = commits[lo]
    co = ws.checkout(first)
    run = run_job(ws, co, job, shorten, timeout)
    cmp = compare_dirs(reference, Path(run["out"]))
    return {
        "probes": probes,
        "first_differing": first,
        "subject": git("log", "-1", "--format=%s", first)[:300],
        "files_changed": git("show", "--format=", "--name-only", first).splitlines(),
        "differing_files": cmp["differing_files"],
        "files": {k: cmp["files"][k] for k in cmp["differing_files"]},
    }


def compare_job(
    ws: Workspace,
    job: str,
    before: Checkout,
    after: Checkout,
    args: argparse.Namespace,
    runs: dict[tuple[str, str, str], dict[str, Any]],
) -> dict[str, Any]:
    rb, ra = runs[(before.sha, job, "run1")], runs[(after.sha, job, "run1")]
    cfg_b = job_config(before, job, args.shorten)
    cfg_a = job_config(after, job, args.shorten)
    entry: dict[str, Any] = {
        "config_same_at_both": cfg_b == cfg_a,
        "shortened": SHORTENED.get(job) if args.shorten and job in SHORTENED else None,
        "seconds": {"before": rb["seconds"], "after": ra["seconds"]},
        "reused": {"before": rb["reused"], "after": ra["reused"]},
    }
    for side, run in (("before", rb), ("after", ra)):
        if run["returncode"] != 0:
            tail = Path(run["log"]).read_text(errors="replace")[-2000:]
            return {**entry, "result": "error", "error": {side: tail, "log": run["log"]}}
    cmp = compare_dirs(Path(rb["out"]), Path(ra["out"]))
    entry["export"] = cmp["export"]
    entry["records"] = cmp["records"]
    entry["result"] = cmp["export"]
    entry["differing_files"] = cmp["differing_files"]
    entry["files"] = cmp["files"]
    entry["excluded_fields_present"] = cmp["excluded_fields_present"]
    entry["new_or_dropped_fields"] = field_origins(cmp["files"], before.sha, after.sha)
    if (cmp["export"] == "differs" and args.determinism == "on-diff") or (
        args.determinism == "always"
    ):
        again = runs.get((before.sha, job, "run2")) or run_job(
            ws, before, job, args.shorten, args.timeout, tag="run2"
        )
        if again["returncode"] == 0:
            self_cmp = compare_dirs(Path(rb["out"]), Path(again["out"]))
            entry["determinism_before"] = {
                "export": self_cmp["export"],
                "records": self_cmp["records"],
                "differing_files": self_cmp["differing_files"],
                "seconds": again["seconds"],
            }
            if cmp["export"] == "differs" and self_cmp["export"] == "differs":
                entry["result"] = "differs_but_nondeterministic_at_before"
        else:
            entry["determinism_before"] = {"error": f"second run failed, see {again['log']}"}
    if entry["result"] == "differs" and args.bisect:
        entry["bisect"] = bisect_job(
            ws, job, before.sha, after.sha, Path(rb["out"]), args.shorten, args.timeout
        )
    return entry


def _last_key(path: str) -> str:
    return re.split(r"[.\[]", path.rstrip("]"))[-1] if path else path


def field_origins(files: dict[str, Any], before: str, after: str) -> dict[str, Any]:
    """For each field present at one revision only (any file): the commits of
    ``before..after`` whose diff of ``engine/`` adds or removes its key's name (``git log -S``),
    a pointer to where the field came from or went, not a proof."""
    keys: dict[str, list[str]] = {}
    for rel, info in files.items():
        entries = info.get("fields_differing", []) + info.get("metadata_differing", [])
        for entry in entries:
            if "<absent>" in (entry["before"], entry["after"]):
                key = _last_key(entry["field"])
                if key and not key.isdigit():
                    keys.setdefault(key, []).append(f"{rel}: {entry['field']}")
    out = {}
    for key, where in sorted(keys.items()):
        found = git("log", "--format=%h %s", f"-S{key}", f"{before}..{after}", "--", "engine")
        out[key] = {
            "fields": sorted(set(where))[:10],
            "commits": [line[:160] for line in found.splitlines()],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.export_identity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--before", required=True, help="the revision before the change")
    ap.add_argument("--after", default="HEAD", help="the revision after (default HEAD)")
    ap.add_argument(
        "--jobs",
        default=None,
        help="comma-separated example names (default: all but the skipped ones)",
    )
    ap.add_argument("--shorten", action="store_true", help="apply SHORTENED to its jobs")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument(
        "--determinism",
        choices=("on-diff", "always", "never"),
        default="on-diff",
        help="run --before again to tell a change from run-to-run noise (default on-diff)",
    )
    ap.add_argument("--bisect", action="store_true", help="find the first differing commit")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/export_identity"))
    ap.add_argument("--out", type=Path, default=None, help="JSON path")
    ap.add_argument("--keep", action="store_true", help="keep the checkouts")
    args = ap.parse_args(argv)

    before_sha, after_sha = resolve(args.before), resolve(args.after)
    ws = Workspace(args.workdir.resolve(), keep=args.keep)
    started = time.time()
    load_start = load_avg()
    try:
        before, after = ws.checkout(before_sha), ws.checkout(after_sha)
        imports = {"before": check_import(before), "after": check_import(after)}
        available = list_jobs(before, after)
        if args.jobs:
            jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
            unknown = sorted(set(jobs) - set(available))
            if unknown:
                ap.error(f"unknown jobs {unknown}; examples: {available}")
        else:
            jobs = [j for j in available if j not in SKIPPED or (args.shorten and j in SHORTENED)]
        skipped = {j: SKIPPED.get(j, "not asked for (--jobs)") for j in available if j not in jobs}
        shortened = {
            j: {"full_length_not_run": SKIPPED.get(j), "overrides": SHORTENED[j]}
            for j in jobs
            if args.shorten and j in SHORTENED
        }
        print(f"before {before_sha[:12]}, after {after_sha[:12]}; jobs {jobs}", flush=True)
        tasks = [(co, job, "run1") for job in jobs for co in (before, after)]
        if args.determinism == "always":
            tasks += [(before, job, "run2") for job in jobs]
        runs: dict[tuple[str, str, str], dict[str, Any]] = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            futures = {
                pool.submit(run_job, ws, co, job, args.shorten, args.timeout, tag): (
                    co.sha,
                    job,
                    tag,
                )
                for co, job, tag in tasks
            }
            for fut in concurrent.futures.as_completed(futures):
                runs[futures[fut]] = fut.result()
        results = {job: compare_job(ws, job, before, after, args, runs) for job in jobs}
    finally:
        ws.close()

    payload = {
        "benchmark": "export_identity",
        "before": {
            "rev": args.before,
            "sha": before_sha,
            "subject": git("log", "-1", "--format=%s", before_sha)[:200],
        },
        "after": {
            "rev": args.after,
            "sha": after_sha,
            "subject": git("log", "-1", "--format=%s", after_sha)[:200],
        },
        "commits_between": len(git("rev-list", f"{before_sha}..{after_sha}").split()),
        "command": "python -m engine.train --config JOB --out DIR --no-progress",
        "environment": {
            **ENV,
            "nice": 10,
            "python": sys.executable,
            "python_version": platform.python_version(),
            "engine_imported_from": imports,
        },
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "load": {"start": load_start, "end": load_avg()},
        "excluded_fields": [{"file": f, "field": p, "reason": why} for f, p, why in EXCLUDED],
        "skipped": skipped,
        "shortened": shortened,
        "reading": (
            "jobs.<job>.result is the verdict on the export (model/ and a trained tokenizer): "
            "identical = every file bitwise equal. jobs.<job>.records is the verdict on the "
            "run's records (report.json, metrics.jsonl, ranks.jsonl, checkpoints/), compared "
            "field by field less excluded_fields; files lists each file's comparison"
        ),
        "summary": {job: r["result"] for job, r in results.items()},
        "jobs": results,
    }
    if args.out is not None:
        path = args.out
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2) + "\n")
    else:
        from bench.common import write_json

        path = write_json("export_identity", payload)
    print(json.dumps(payload["summary"], indent=1))
    print(f"wrote {path}")
    bad = [
        j
        for j, r in results.items()
        if r["result"] not in ("identical", "identical_except_excluded_fields")
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
