"""The main job on the embedded service: start ``comera up``, submit, follow, download, report.

    python examples/service/run_embedded.py [SPEC.json] [--home DIR] [--out DIR]

Starts ``comera up`` (SQLite store, SQLite-backed broker, one local worker) on a free port,
submits the job spec over HTTP, prints progress until the job ends, downloads the compressed
model (checking its sha256 against the server's ETag) and prints the compression report,
then stops the service. Exit status 0 only when the job SUCCEEDED.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(client: httpx.Client, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"comera up exited with status {proc.returncode}")
        try:
            if client.get("/v1/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    sys.exit("the service did not become ready")


def _follow(client: httpx.Client, job_id: str) -> dict:
    last = None
    while True:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        p, m, c = job["progress"], job["latest_metrics"], job["compression"]
        line = (
            f"{job['state']:<10} stage {p.get('stage_name') or '-':<10} "
            f"step {p.get('step', 0):>5}/{p.get('total_steps') or '?':<5} "
            f"loss {m.get('loss', float('nan')):.4f}  "
            f"ratio x{c.get('current_ratio') or 1:.1f}"
        )
        if line != last:
            print(line, flush=True)
            last = line
        if job["state"] in TERMINAL:
            return job
        time.sleep(1.0)


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
    args = ap.parse_args()
    args.home.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = (args.home / "comera-up.log").open("w")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    cmd = [sys.executable, "-m", "service.cli", "up", "--home", str(args.home), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    print(f"comera up on port {port} (home {args.home}, log {log.name})", flush=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            _wait_ready(client, proc)
            # the first start of ``comera up`` makes an API key and leaves it here (0600)
            key = (args.home / "api_key").read_text().strip()
            client.headers["Authorization"] = f"Bearer {key}"
            r = client.post(
                "/v1/jobs",
                json=json.loads(args.spec.read_text()),
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
            if r.status_code != 202:
                print(json.dumps(r.json(), indent=2))
                return 1
            job_id = r.json()["id"]
            print(f"submitted {job_id} ({r.headers['location']})", flush=True)
            job = _follow(client, job_id)
            if job["state"] != "SUCCEEDED":
                print(json.dumps(job.get("error"), indent=2))
                return 1
            path = _download(client, job_id, args.out)
            report = client.get(f"/v1/jobs/{job_id}/report").raise_for_status().json()
            print(f"downloaded {path} ({path.stat().st_size:,} bytes, sha256 verified)")
            print(
                f"compressed file: {report['file_bytes']:,} bytes vs dense "
                f"{report['dense_bytes']:,} (x{report['file_ratio']:.1f}); "
                f"metrics {json.dumps(report['metrics'])}"
            )
            print(
                f"tensorized layers x{report['tensorized_ratio']:.1f}, whole model "
                f"x{report['model_ratio']:.2f}:"
            )
            for layer in report["layers"]:
                ratio = "cut" if layer["ratio"] is None else f"x{layer['ratio']:.1f}"
                print(
                    f"  {layer['name']:<20} {layer['kind']:<14} {layer['dense_params']:>7,} -> "
                    f"{layer['params']:>6,} ({ratio})  ranks {layer['ranks']}"
                )
            return 0
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
