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

Jobs skipped by default (:data:`SKIPPED`) take more than about two minutes on the shared 2-core
host. ``--shorten`` runs them with the overrides of :data:`SHORTENED` instead (fewer steps and
sentences; the same config at both revisions, written beside the runs); ``--jobs`` names the
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
import copy
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.identity_compare import (
    DONE,
    EXCLUDED,
    compare_dirs,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = "examples/engine"

SKIPPED: dict[str, str] = {
    "minilm_hf": (
        "hf_bert recipe: sequential fit on 7,750 sentences + 2,400 distillation steps on 32,000 "
        "sentences, 627 s on an idle 2-core host (examples/engine/README.md), far over 2 min; "
        "--shorten runs it shortened"
    ),
    "minilm_transformers": (
        "1 min 42 s on an idle 2-core host (examples/engine/README.md): over 2 min on this "
        "shared host; --shorten runs it shortened"
    ),
}

# Shortened configs (--shorten), the same at both revisions: dotted path -> value.
SHORTENED: dict[str, dict[str, Any]] = {
    "minilm_transformers": {
        "data.n_train": 640,
        "data.n_valid": 64,
        "model.config.calibration_sentences": 64,
        "schedule[0].steps": 12,
        "schedule[0].warmup_steps": 2,
    },
    "minilm_hf": {
        "data.n_train": 640,
        "data.n_valid": 64,
        "data.params.packages": [],
        "model.config.calibration_sentences": 320,  # fewer: the FFN inputs' Gram matrix singular
        "model.config.probe_sentences": 8,
        "schedule[0].steps": 12,
        "schedule[0].warmup_steps": 2,
    },
}

ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "",
}


# -- checkouts and runs -----------------------------------------------------------------------
def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


def resolve(rev: str) -> str:
    return git("rev-parse", "--verify", f"{rev}^{{commit}}")


@dataclass
class Checkout:
    sha: str
    path: Path
    created: bool = False


@dataclass
class Workspace:
    root: Path
    keep: bool = False
    checkouts: dict[str, Checkout] = field(default_factory=dict)

    def checkout(self, sha: str) -> Checkout:
        if sha in self.checkouts:
            return self.checkouts[sha]
        path = self.root / "src" / sha[:12]
        created = False
        if not (path / ".git").exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            git("worktree", "add", "--detach", str(path), sha)
            created = True
        if git("rev-parse", "HEAD", cwd=path) != sha:
            raise RuntimeError(f"{path} is not at {sha}")
        self.checkouts[sha] = Checkout(sha, path, created)
        return self.checkouts[sha]

    def close(self) -> None:
        if self.keep:
            return
        for co in self.checkouts.values():
            if co.created:
                git("worktree", "remove", "--force", str(co.path))
        git("worktree", "prune")


def set_path(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """``doc[a][b][i] = value`` for ``dotted`` = "a.b[i]"."""
    keys: list[Any] = []
    for part in dotted.split("."):
        name, _, rest = part.partition("[")
        if name:
            keys.append(name)
        while rest:
            idx, _, rest = rest.partition("]")
            keys.append(int(idx))
            rest = rest.lstrip("[")
    target: Any = doc
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value


def job_config(co: Checkout, job: str, shorten: bool) -> dict[str, Any]:
    config = json.loads((co.path / EXAMPLES / f"{job}.json").read_text())
    if shorten and job in SHORTENED:
        config = copy.deepcopy(config)
        for dotted, value in SHORTENED[job].items():
            set_path(config, dotted, value)
    return config


def child_env(co: Checkout) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    env.update(ENV)
    env["PYTHONPATH"] = str(co.path)
    return env


def check_import(co: Checkout) -> str:
    """Where ``import engine`` resolves in the child's environment (must be the checkout)."""
    where = subprocess.run(
        [sys.executable, "-c", "import engine; print(engine.__file__)"],
        cwd=co.path,
        env=child_env(co),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(co.path.resolve()):
        raise RuntimeError(f"engine imported from {where}, not from the checkout {co.path}")
    return where


def run_job(
    ws: Workspace, co: Checkout, job: str, shorten: bool, timeout: float, tag: str = "run1"
) -> dict[str, Any]:
    """One run of ``job`` at ``co`` (reused when a completed run of the same config exists)."""
    config = job_config(co, job, shorten)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256((text + json.dumps(ENV, sort_keys=True)).encode()).hexdigest()[:12]
    out = ws.root / "runs" / co.sha[:12] / f"{job}-{digest}-{tag}"
    done = out / DONE
    if done.exists():
        return {**json.loads(done.read_text()), "reused": True}
    if out.exists():
        shutil.rmtree(out)
    cfg_path = ws.root / "configs" / f"{job}-{digest}.json"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["nice", "-n", "10", sys.executable, "-m", "engine.train"]
    cmd += ["--config", str(cfg_path), "--out", str(out), "--no-progress"]
    log = ws.root / "logs" / f"{co.sha[:12]}-{job}-{digest}-{tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"  {co.sha[:12]} {job} ({tag}) ...", flush=True)
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=co.path, env=child_env(co), stdout=fh, stderr=fh, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    seconds = round(time.perf_counter() - t0, 1)
    info = {
        "sha": co.sha,
        "job": job,
        "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "out": str(out),
        "log": str(log),
        "returncode": rc,
        "seconds": seconds,
        "timed_out": rc is None,
    }
    print(f"  {co.sha[:12]} {job} ({tag}): rc {rc}, {seconds} s", flush=True)
    if rc == 0:
        done.write_text(json.dumps(info, indent=2) + "\n")
    return {**info, "reused": False}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


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


def list_jobs(before: Checkout, after: Checkout) -> list[str]:
    names = [{p.stem for p in (co.path / EXAMPLES).glob("*.json")} for co in (before, after)]
    return sorted(names[0] | names[1])


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
    load_start = _load()
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
        "load": {"start": load_start, "end": _load()},
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
