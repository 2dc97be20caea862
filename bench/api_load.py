"""API load: ``GET /v1/jobs/{id}`` and ``POST /v1/jobs`` against PostgreSQL, 100 clients.

    python -m bench.api_load [--clients 100] [--jobs 200] [--seconds 10] [--server-workers 1]

Starts the API (``comera api``) in its own process(es) on a fresh, migrated PostgreSQL
database (127.0.0.1:5432) with a Redis broker (127.0.0.1:6379, a queue no worker reads), then
drives it from one asyncio process with ``--clients`` concurrent httpx clients:

1. ``POST /v1/jobs``: the clients submit ``--jobs`` jobs (a small valid spec; every request
   runs the full submission path: validation, the planner's model check, the insert and the
   broker send);
2. ``GET /v1/jobs/{id}``, closed loop: every client sends its next request as soon as the
   previous one answered, for ``--seconds``: the throughput ceiling, where latency is mostly
   queueing (Little's law: latency ~ clients / throughput);
3. ``GET /v1/jobs/{id}``, open loop: the same clients send at a fixed total rate (``--rate``,
   default half the closed-loop throughput), each on its own schedule: the latency a client
   sees when the server is busy but not saturated.

Latency is measured in the client around each request (the load generator shares the 2
cores with the server). Writes ``bench/results/api_load.json`` with machine info.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from bench.common import machine_info, write_json
from service.db.migrate import upgrade

ROOT = Path(__file__).resolve().parents[1]
PG = os.environ.get("COMERA_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
TARGET_GET_P99_MS = 25.0
SPEC = {
    "name": "load-mlp", "labels": {"bench": "api_load"},
    "model": {"arch": "mlp", "config": {"hidden": [64, 64]}},
    "dataset": {"source": "synthetic", "n_train": 256, "n_valid": 32},
    "compression": {"max_rank": 4, "min_size": 256},
    "schedule": [{"kind": "early", "steps": 5}],
}  # fmt: skip


def _percentiles(ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"p50_ms": round(q[49], 2), "p90_ms": round(q[89], 2), "p99_ms": round(q[98], 2),
            "max_ms": round(max(ms), 2), "n": len(ms)}  # fmt: skip


async def _post_phase(client: httpx.AsyncClient, clients: int, jobs: int) -> tuple[dict, list]:
    latencies: list[float] = []
    ids: list[str] = []
    todo = iter(range(jobs))

    async def one_client() -> None:
        for i in todo:
            t0 = time.perf_counter()
            r = await client.post("/v1/jobs", json={**SPEC, "name": f"load-{i}"},
                                  headers={"Idempotency-Key": uuid.uuid4().hex})  # fmt: skip
            latencies.append((time.perf_counter() - t0) * 1e3)
            if r.status_code != 202:
                raise RuntimeError(f"POST failed: {r.status_code} {r.text[:300]}")
            ids.append(r.json()["id"])

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {"requests": jobs, "seconds": round(wall, 3), "throughput_rps": round(jobs / wall, 1),
            **_percentiles(latencies)}, ids  # fmt: skip


RETRIES = {"get": 0}  # keep-alive connections the server closed as they were reused


async def _get(client: httpx.AsyncClient, job_id: str, latencies: list[float]) -> None:
    t0 = time.perf_counter()
    try:
        r = await client.get(f"/v1/jobs/{job_id}")
    except httpx.TransportError:  # GET is idempotent: retry once, as a client would
        RETRIES["get"] += 1
        r = await client.get(f"/v1/jobs/{job_id}")
    latencies.append((time.perf_counter() - t0) * 1e3)
    if r.status_code != 200:
        raise RuntimeError(f"GET failed: {r.status_code} {r.text[:300]}")


async def _get_closed(client: httpx.AsyncClient, ids: list[str], clients: int,
                      seconds: float) -> dict[str, Any]:  # fmt: skip
    latencies: list[float] = []
    end = time.perf_counter() + seconds
    rng = random.Random(0)

    async def one_client() -> None:
        while time.perf_counter() < end:
            await _get(client, rng.choice(ids), latencies)

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {
        "mode": "closed loop",
        "seconds": round(wall, 3),
        "throughput_rps": round(len(latencies) / wall, 1),
        **_percentiles(latencies),
    }


async def _get_open(client: httpx.AsyncClient, ids: list[str], clients: int, seconds: float,
                    rate: float) -> dict[str, Any]:  # fmt: skip
    latencies: list[float] = []
    per_client = rate / clients
    rng = random.Random(1)
    start = time.perf_counter()
    late = 0

    async def one_client(k: int) -> None:
        nonlocal late
        t = start + k / rate  # staggered starts
        while t < start + seconds:
            delay = t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late += 1
            await _get(client, rng.choice(ids), latencies)
            t += 1.0 / per_client

    await asyncio.gather(*(one_client(k) for k in range(clients)))
    wall = time.perf_counter() - start
    return {"mode": "open loop", "offered_rps": round(rate, 1), "seconds": round(wall, 3),
            "throughput_rps": round(len(latencies) / wall, 1), "sent_late": late,
            **_percentiles(latencies)}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the API exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    sys.exit("the API did not become ready")


async def _drive(url: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120,
                                 headers={"Authorization": f"Bearer {key}"}) as client:
        # warm-up: the planner process, connection pools, first queries
        for _ in range(3):
            r = await client.post("/v1/jobs", json={**SPEC, "name": "warmup"},
                                  headers={"Idempotency-Key": uuid.uuid4().hex})  # fmt: skip
            r.raise_for_status()
            await client.get(f"/v1/jobs/{r.json()['id']}")
        post, ids = await _post_phase(client, args.clients, args.jobs)
        print(f"POST  {post['throughput_rps']:8.1f} req/s  p50 {post['p50_ms']:7.2f} ms  "
              f"p99 {post['p99_ms']:7.2f} ms", flush=True)  # fmt: skip
        closed = await _get_closed(client, ids, args.clients, args.seconds)
        print(f"GET   {closed['throughput_rps']:8.1f} req/s  p50 {closed['p50_ms']:7.2f} ms  "
              f"p99 {closed['p99_ms']:7.2f} ms  (closed loop)", flush=True)  # fmt: skip
        rate = args.rate or closed["throughput_rps"] / 2
        opened = await _get_open(client, ids, args.clients, args.seconds, rate)
        print(f"GET   {opened['throughput_rps']:8.1f} req/s  p50 {opened['p50_ms']:7.2f} ms  "
              f"p99 {opened['p99_ms']:7.2f} ms  (open loop, {rate:.0f} req/s offered)",
              flush=True)  # fmt: skip
    return {"post": post, "get_closed_loop": closed, "get_open_loop": opened}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=None, help="open-loop GET rate (req/s)")
    ap.add_argument("--server-workers", type=int, default=1, help="API processes")
    args = ap.parse_args()

    name = f"comera_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine("postgresql+psycopg://" + PG.removeprefix("postgresql://"),
                          isolation_level="AUTOCOMMIT")  # fmt: skip
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db = PG.rsplit("/", 1)[0] + f"/{name}"
    port, home = _free_port(), Path(f"/tmp/{name}")
    queue = f"bench.{name}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    env.update(COMERA_DATABASE_URL=db, COMERA_BROKER_URL="redis://127.0.0.1:6379/13",
               COMERA_QUEUE=queue, COMERA_HOME=str(home),
               COMERA_MAX_QUEUED_JOBS_PER_TENANT="100000",
               COMERA_RATE_LIMIT_PER_MINUTE="0")  # one key, 100 clients: no rate limit  # fmt: skip
    proc = None
    try:
        upgrade(db)
        key = subprocess.run([sys.executable, "-m", "service.cli", "keys", "create", "--tenant",
                              "bench"], env=env, cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
        cmd = [sys.executable, "-m", "service.cli", "api", "--port", str(port),
               "--workers", str(args.server_workers), "--no-access-log"]  # fmt: skip
        home.mkdir(parents=True, exist_ok=True)
        log = home / "api.log"
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("w"),
                                stderr=subprocess.STDOUT)  # fmt: skip
        print(f"API log: {log}", flush=True)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc)
        load0 = os.getloadavg()
        results = asyncio.run(_drive(url, key, args))
        load1 = os.getloadavg()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        import redis

        redis.Redis.from_url("redis://127.0.0.1:6379/13").delete(queue)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    p99 = min(results["get_closed_loop"]["p99_ms"], results["get_open_loop"]["p99_ms"])
    payload = {
        "benchmark": "api_load", "machine": machine_info(), "database": "postgresql",
        "broker": "redis", "server_workers": args.server_workers, "clients": args.clients,
        "jobs_stored": args.jobs + 3, "load_avg_before": load0, "load_avg_after": load1,
        "target": {"get_p99_ms": TARGET_GET_P99_MS}, "results": results,
        "checks": {"get_p99_open_loop_under_target":
                   results["get_open_loop"]["p99_ms"] < TARGET_GET_P99_MS,
                   "get_p99_closed_loop_under_target":
                   results["get_closed_loop"]["p99_ms"] < TARGET_GET_P99_MS},
        "best_get_p99_ms": p99, "get_retries_after_closed_keepalive": RETRIES["get"],
    }  # fmt: skip
    print(f"wrote {write_json('api_load', payload)}")


if __name__ == "__main__":
    main()
