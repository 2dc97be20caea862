"""The load generator of :mod:`bench.api_load`: the job spec it submits, the ``POST`` phase,
the closed- and open-loop ``GET`` phases over per-client connections, their latency
percentiles, and the count of requests sent again after the server closed a kept-alive
connection (:data:`RETRIES`)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from typing import Any

import httpx

SPEC = {
    "name": "load-mlp",
    "labels": {"bench": "api_load"},
    "model": {"arch": "mlp", "config": {"hidden": [64, 64]}},
    "dataset": {"source": "synthetic", "n_train": 256, "n_valid": 32},
    "compression": {"max_rank": 4, "min_size": 256},
    "schedule": [{"kind": "early", "steps": 5}],
}


def percentiles(ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {
        "p50_ms": round(q[49], 2),
        "p90_ms": round(q[89], 2),
        "p99_ms": round(q[98], 2),
        "max_ms": round(max(ms), 2),
        "n": len(ms),
    }


async def post_phase(client: httpx.AsyncClient, clients: int, jobs: int) -> tuple[dict, list]:
    """``jobs`` submissions by ``clients`` clients of one tenant. The tenant's share of the
    planner (``COMERA_PLANS_PER_TENANT``) answers the excess 429 and a planner busy past its
    deadline 503, both with ``Retry-After``: the client waits that long and sends the same
    request again (same ``Idempotency-Key``), as a client should. Latency is per job, from
    its first attempt to its 202."""
    latencies: list[float] = []
    ids: list[str] = []
    refused = {429: 0, 503: 0}
    todo = iter(range(jobs))

    async def one_client() -> None:
        for i in todo:
            t0, key = time.perf_counter(), uuid.uuid4().hex
            while True:
                try:
                    r = await client.post(
                        "/v1/jobs",
                        json={**SPEC, "name": f"load-{i}"},
                        headers={"Idempotency-Key": key},
                    )
                except httpx.TransportError:  # a kept-alive connection the server closed
                    RETRIES["post"] += 1  # the same Idempotency-Key: safe to send again
                    continue
                if r.status_code not in refused:
                    break
                refused[r.status_code] += 1
                await asyncio.sleep(float(r.headers.get("retry-after", "1")))
            latencies.append((time.perf_counter() - t0) * 1e3)
            if r.status_code != 202:
                raise RuntimeError(f"POST failed: {r.status_code} {r.text[:300]}")
            ids.append(r.json()["id"])

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {
        "requests": jobs,
        "seconds": round(wall, 3),
        "throughput_rps": round(jobs / wall, 1),
        "refused_429": refused[429],
        "refused_503": refused[503],
        **percentiles(latencies),
    }, ids


RETRIES = {"get": 0, "post": 0}  # kept-alive connections the server closed as they were reused


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


def make_pollers(url: str, key: str, n: int, shared: bool = False) -> list[httpx.AsyncClient]:
    """``n`` clients of one connection each, as ``n`` polling users would be; ``shared``:
    one client whose pool of ``n`` connections the ``n`` pollers share (the first version of
    this benchmark: httpx then spends several times more CPU per request)."""
    headers = {"Authorization": f"Bearer {key}"}
    if shared:
        pool = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        return [httpx.AsyncClient(base_url=url, limits=pool, timeout=120, headers=headers)] * n
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return [
        httpx.AsyncClient(base_url=url, limits=one, timeout=120, headers=headers) for _ in range(n)
    ]


async def get_closed(
    pollers: list[httpx.AsyncClient], ids: list[str], seconds: float
) -> dict[str, Any]:
    latencies: list[float] = []
    end = time.perf_counter() + seconds
    rng = random.Random(0)

    async def one_client(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < end:
            await _get(client, rng.choice(ids), latencies)

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client(c) for c in pollers))
    wall = time.perf_counter() - t0
    return {
        "mode": "closed loop",
        "clients": len(pollers),
        "seconds": round(wall, 3),
        "throughput_rps": round(len(latencies) / wall, 1),
        **percentiles(latencies),
    }


async def get_open(
    pollers: list[httpx.AsyncClient], ids: list[str], seconds: float, rate: float
) -> dict[str, Any]:
    latencies: list[float] = []
    clients = len(pollers)
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
            await _get(pollers[k], rng.choice(ids), latencies)
            t += 1.0 / per_client

    await asyncio.gather(*(one_client(k) for k in range(clients)))
    wall = time.perf_counter() - start
    return {
        "mode": "open loop",
        "offered_rps": round(rate, 1),
        "seconds": round(wall, 3),
        "throughput_rps": round(len(latencies) / wall, 1),
        "sent_late": late,
        **percentiles(latencies),
    }
