"""How :mod:`bench.export_identity` gets its runs: throwaway checkouts of a revision
(``git worktree add --detach``), the example jobs' configs (optionally shortened), and one run
of a job at a checkout with this interpreter in a fixed environment, reused when a completed
run of the same config exists."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.identity_compare import DONE

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


def list_jobs(before: Checkout, after: Checkout) -> list[str]:
    names = [{p.stem for p in (co.path / EXAMPLES).glob("*.json")} for co in (before, after)]
    return sorted(names[0] | names[1])
