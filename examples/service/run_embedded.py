"""The main job on the embedded service: start ``comera up``, submit, follow, download, report.

    python examples/service/run_embedded.py [SPEC.json] [--baseline] [--home DIR] [--out DIR]

Starts ``comera up`` (SQLite store, SQLite-backed broker, one local worker) on a free port,
submits the job spec over HTTP (with ``--baseline`` also its dense twin, which the report
compares it with), prints progress until the job ends, downloads the compressed model
(checking its sha256 against the server's ETag) and prints what the user got: the layers,
then the accuracy (beside the dense baseline's when one ran, and chance), the tensorized
layers' compression, the whole model's and the file's; then stops the service. Exit status
0 only when the job SUCCEEDED.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 180) -> None:
    """Until ``GET url/v1/readyz`` answers 200; exit if ``proc`` (``comera up``) ends first
    or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"comera up exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/readyz", timeout=10).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    sys.exit(f"no service became ready at {url}")


@contextlib.contextmanager
def comera_up(home: Path, log_name: str, port: int | None = None) -> Iterator[str]:
    """``comera up`` on ``home`` (on ``port``, else a free one; its output in
    ``home/log_name``, without the caller's ``COMERA_`` settings); yields its URL once it is
    ready, and stops it (SIGINT, killed after 90 s) on the way out."""
    port = free_port() if port is None else port
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    cmd = [sys.executable, "-m", "service.cli", "up", "--home", str(home), "--port", str(port)]
    with (home / log_name).open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()


def _follow(client: httpx.Client, job_id: str) -> dict:
    """Print the job's progress (on a change of state or stage, else every 5 s) until it ends."""
    last, shown = None, 0.0
    while True:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        p, m, c = job["progress"], job["latest_metrics"], job["compression"]
        line = (
            f"{job['state']:<10} stage {p.get('stage_name') or '-':<10} "
            f"step {p.get('step', 0):>5}/{p.get('total_steps') or '?':<5} "
            f"loss {m.get('loss', float('nan')):.4f}  "
            f"ratio x{c.get('current_ratio') or 1:.1f}"
        )
        head = (job["state"], p.get("stage_name"))
        if head != last or time.monotonic() - shown >= 5 or job["state"] in TERMINAL:
            print(line, flush=True)
            last, shown = head, time.monotonic()
        if job["state"] in TERMINAL:
            return job
        time.sleep(1.0)


def dense_twin(spec: dict) -> dict:
    """The same job untensorized: its dense baseline (same model, data, training and total
    steps and epochs, ``compression.method`` "dense", every stage ``early``), which the
    service's report puts beside the compressed job's metrics."""
    stages = spec["schedule"]
    first = stages[0]
    twin: list[dict] = []
    for total in ("epochs", "steps"):
        n = sum(s.get(total) or 0 for s in stages)
        if n:
            stage = {"kind": "early", total: n, "lr": first.get("lr", {})}
            if "eval_every" in first:
                stage["eval_every"] = first["eval_every"]
            twin.append(stage)
    return {
        **spec,
        "name": f"{spec.get('name', 'job')}-dense",
        "labels": {**spec.get("labels", {}), "baseline": "dense"},
        "compression": {"method": "dense"},
        "schedule": twin,
    }


def _submit(client: httpx.Client, spec: dict) -> str | None:
    r = client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": uuid.uuid4().hex})
    if r.status_code != 202:
        print(json.dumps(r.json(), indent=2))
        return None
    print(f"submitted {spec.get('name')}: {r.json()['id']} ({r.headers['location']})", flush=True)
    return r.json()["id"]


def _accuracy(metrics: dict) -> tuple[str, float] | None:
    for key in ("val_accuracy", "accuracy", "val_cosine", "cosine"):
        if key in metrics:
            return key, metrics[key]
    return None


def summary(report: dict) -> list[str]:
    """What a newcomer got, one labelled line each: the compressed model's accuracy beside
    the dense baseline's, the tensorized layers' ratio, the whole model's, the saved file."""
    lines = []
    mine = _accuracy(report["metrics"])
    base = report.get("baseline")
    theirs = _accuracy(base["metrics"]) if base else None
    if mine is not None:
        key, value = mine
        line = f"  {key.removeprefix('val_'):<18} {value:.4f} compressed"
        if theirs is not None and theirs[0] == key:
            line += f" vs {theirs[1]:.4f} dense baseline ({base['job_id']}: same model, data "
            line += "and steps, untensorized)"
        else:
            line += " (no dense baseline trained in this run: --baseline trains one)"
        chance = (report.get("chance") or {}).get("chance")
        line += " on the validation split" + ("" if chance is None else f"; chance {chance:.2f}")
        lines.append(line)
    layers = report["layers"]
    if report.get("tensorized_ratio") is not None and layers:
        dense = sum(layer["dense_params"] for layer in layers)
        tt = sum(layer["params"] for layer in layers)
        lines.append(
            f"  {'tensorized layers':<18} x{report['tensorized_ratio']:.1f} smaller: the "
            f"{len(layers)} layers in TT form, {dense:,} -> {tt:,} parameters"
        )
    if report.get("model_ratio") is not None:
        lines.append(
            f"  {'whole model':<18} x{report['model_ratio']:.2f} smaller: "
            f"{report['params_dense']:,} -> {report['params']:,} parameters "
            "(what is not tensorized stays dense)"
        )
    lines.append(
        f"  {'saved file':<18} x{report['file_ratio']:.2f} smaller: "
        f"{report['file_bytes']:,} bytes vs {report['dense_bytes']:,} dense"
    )
    return lines


def _download(client: httpx.Client, job_id: str, out: Path) -> Path:
    items = client.get(f"/v1/jobs/{job_id}/checkpoints").raise_for_status().json()["items"]
    export = next(c for c in items if c["kind"] == "export" and c["state"] == "complete")
    path = out / f"{job_id}.safetensors"
    digest = hashlib.sha256()
    with client.stream("GET", f"/v1/jobs/{job_id}/checkpoints/{export['id']}/content") as r:
        r.raise_for_status()
        etag = r.headers["etag"].strip('"').removeprefix("sha256:")
        with path.open("wb") as f:
            for chunk in r.iter_bytes():
                digest.update(chunk)
                f.write(chunk)
    if digest.hexdigest() != etag:
        sys.exit(f"download corrupted: sha256 {digest.hexdigest()} != {etag}")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", default=ROOT / "examples/service/nli_job.json", type=Path)
    ap.add_argument("--home", type=Path, default=ROOT / "runs/service")
    ap.add_argument("--out", type=Path, default=ROOT / "runs/service/downloads")
    ap.add_argument(
        "--baseline",
        action="store_true",
        help="also train the dense twin (same model, data and steps, untensorized; about half "
        "again the time), so the report puts the dense accuracy beside the compressed one",
    )
    args = ap.parse_args()
    t0 = time.monotonic()
    args.home.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    print(
        f"comera up on port {port} (home {args.home}, log {args.home / 'comera-up.log'})",
        flush=True,
    )
    with (
        comera_up(args.home, "comera-up.log", port) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        # the first start of ``comera up`` makes an API key and leaves it here (0600)
        key = (args.home / "api_key").read_text().strip()
        client.headers["Authorization"] = f"Bearer {key}"
        spec = json.loads(args.spec.read_text())
        job_id = _submit(client, spec)
        # the dense twin queues behind it on the one worker; the report compares the two
        twin_id = _submit(client, dense_twin(spec)) if args.baseline else None
        if job_id is None or (args.baseline and twin_id is None):
            return 1
        job = _follow(client, job_id)
        if job["state"] != "SUCCEEDED":
            print(json.dumps(job.get("error"), indent=2))
            return 1
        path = _download(client, job_id, args.out)
        print(f"downloaded {path} ({path.stat().st_size:,} bytes, sha256 verified)")
        if twin_id is not None:
            print(f"training the dense baseline {twin_id} (same model, data and steps)")
            twin = _follow(client, twin_id)
            if twin["state"] != "SUCCEEDED":
                print(json.dumps(twin.get("error"), indent=2))
                return 1
        report = client.get(f"/v1/jobs/{job_id}/report").raise_for_status().json()
        print(f"\nper layer ({job_id}):")
        for layer in report["layers"]:
            ratio = "cut" if layer["ratio"] is None else f"x{layer['ratio']:.1f}"
            print(
                f"  {layer['name']:<20} {layer['kind']:<14} {layer['dense_params']:>7,} -> "
                f"{layer['params']:>6,} ({ratio})  ranks {layer['ranks']}"
            )
        print(f"\nwhat you got ({time.monotonic() - t0:.0f} s in all):")
        print("\n".join(summary(report)))
        print(
            f"see it on the dashboard: .venv/bin/comera up --home {args.home} --port 8000, "
            f"then open http://127.0.0.1:8000/#job={job_id} (API key in {args.home}/api_key)"
        )
        return 0


if __name__ == "__main__":
    sys.exit(main())
