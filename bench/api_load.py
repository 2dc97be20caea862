"""API load: ``GET /v1/jobs/{id}`` and ``POST /v1/jobs`` against PostgreSQL, 100 clients.

    python -m bench.api_load [--clients 100] [--jobs 200] [--seconds 10] [--rounds 3]
                             [--server-workers 1] [--server-env COMERA_X=...]

Starts the API (``comera api``) in its own process(es) on a fresh, migrated PostgreSQL
database (127.0.0.1:5432) with a Redis broker (127.0.0.1:6379, a queue no worker reads), then
drives it from one asyncio process with ``--clients`` concurrent httpx clients, each with its
own connection (one pool shared by 100 requests costs httpx several times more CPU per
request than one connection per client, and the generator shares the cores with the server):

1. ``POST /v1/jobs``: the clients submit ``--jobs`` jobs (a small valid spec; every request
   runs the full submission path: validation, the plan, the insert and the broker send); one
   tenant's excess plans are refused with 429 + ``Retry-After`` and sent again after it;
2. ``GET /v1/jobs/{id}``, closed loop: every client sends its next request as soon as the
   previous one answered, for ``--seconds``: the throughput ceiling, where latency is mostly
   queueing (Little's law: latency ~ clients / throughput). One client and ``--clients``
   clients alternate for ``--rounds`` rounds (other load on the machine drifts; alternating
   shares the drift), and the medians are compared: under concurrency the API must keep at
   least ``MIN_CONCURRENT_SHARE`` of its one-client throughput;
3. ``GET /v1/jobs/{id}``, open loop: the same clients send at a fixed total rate (``--rate``,
   default half the closed-loop throughput), each on its own schedule: the latency a client
   sees when the server is busy but not saturated.

Latency is measured in the client around each request (the load generator shares the 2
cores with the server: the CPU seconds it used in each phase are reported next to the
server's, read from ``/proc``). Writes ``bench/results/api_load.json`` with machine info.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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

from bench.api_load_phases import (
    RETRIES,
    SPEC,
    get_closed,
    get_open,
    make_pollers,
    post_phase,
)
from bench.common import machine_info, write_json
from service.store.db.migrate import upgrade

ROOT = Path(__file__).resolve().parents[1]
PG = os.environ.get("COMERA_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
TARGET_GET_P99_MS = 25.0
MIN_CONCURRENT_SHARE = 0.7  # many-client GET throughput / one-client GET throughput


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


def _tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        todo += [int(c) for c in children]
    return total


class CpuMeter:
    """CPU seconds of the load generator (this process) and of the server over a phase."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid

    def __enter__(self) -> CpuMeter:
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.s0 = _tree_cpu_seconds(self.server_pid)
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self.t0
        self.figures = {
            "client_cpu_s": round(time.process_time() - self.c0, 2),
            "server_cpu_s": round(_tree_cpu_seconds(self.server_pid) - self.s0, 2),
            "wall_s": round(wall, 2),
        }


def _line(name: str, r: dict[str, Any], note: str = "") -> None:
    print(
        f"{name:5} {r['throughput_rps']:8.1f} req/s  p50 {r['p50_ms']:7.2f} ms  "
        f"p99 {r['p99_ms']:7.2f} ms  {note}",
        flush=True,
    )


async def _closed_rounds(
    url: str, key: str, ids: list[str], args: argparse.Namespace, server_pid: int
) -> dict[str, Any]:
    """One client, then ``--clients`` clients, ``--rounds`` times; per round and medians."""
    single = make_pollers(url, key, 1)
    many = make_pollers(url, key, args.clients, shared=args.shared_pool)
    rounds: dict[str, list[dict[str, Any]]] = {"one_client": [], "clients": []}
    try:
        await get_closed(many, ids, 1.0)  # open every connection before measuring
        for _ in range(args.rounds):
            for name, pollers in (("one_client", single), ("clients", many)):
                with CpuMeter(server_pid) as cpu:
                    r = await get_closed(pollers, ids, args.seconds)
                r["cpu"] = cpu.figures
                n = r["n"]
                r["server_cpu_ms_per_request"] = round(1e3 * cpu.figures["server_cpu_s"] / n, 2)
                r["client_cpu_ms_per_request"] = round(1e3 * cpu.figures["client_cpu_s"] / n, 2)
                rounds[name].append(r)
                _line("GET", r, f"(closed loop, {r['clients']} client(s))")
    finally:
        for c in {id(c): c for c in single + many}.values():
            await c.aclose()

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[key] for r in rounds[name]), 2)

    one, n = median("one_client", "throughput_rps"), median("clients", "throughput_rps")
    return {
        "rounds": rounds,
        "one_client_median_rps": one,
        "clients_median_rps": n,
        "share": round(n / one, 3),
        "share_per_round": [
            round(b["throughput_rps"] / a["throughput_rps"], 3)
            for a, b in zip(rounds["one_client"], rounds["clients"], strict=True)
        ],
        "server_cpu_ms_per_request": {
            "one_client": median("one_client", "server_cpu_ms_per_request"),
            "clients": median("clients", "server_cpu_ms_per_request"),
        },
    }


async def _drive(url: str, key: str, args: argparse.Namespace, server_pid: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=120, headers={"Authorization": f"Bearer {key}"}
    ) as client:
        # warm-up: the planner process, connection pools, first queries
        for _ in range(3):
            r = await client.post(
                "/v1/jobs",
                json={**SPEC, "name": "warmup"},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
            r.raise_for_status()
            await client.get(f"/v1/jobs/{r.json()['id']}")
        post, ids = await post_phase(client, args.clients, args.jobs)
        _line("POST", post)
    closed = await _closed_rounds(url, key, ids, args, server_pid)
    print(
        f"GET   median {closed['clients_median_rps']} req/s with {args.clients} clients, "
        f"{closed['one_client_median_rps']} with one: {closed['share']:.0%}",
        flush=True,
    )
    rate = args.rate or closed["clients_median_rps"] / 2
    pollers = make_pollers(url, key, args.clients, shared=args.shared_pool)
    try:
        opened = await get_open(pollers, ids, args.seconds, rate)
    finally:
        for c in {id(c): c for c in pollers}.values():
            await c.aclose()
    _line("GET", opened, f"(open loop, {rate:.0f} req/s offered)")
    return {"post": post, "get_closed_loop": closed, "get_open_loop": opened}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0, help="per measured phase")
    ap.add_argument("--rounds", type=int, default=3, help="closed-loop 1 / N client rounds")
    ap.add_argument(
        "--shared-pool",
        action="store_true",
        help="the N clients share one httpx pool (the first version's load generator)",
    )
    ap.add_argument("--rate", type=float, default=None, help="open-loop GET rate (req/s)")
    ap.add_argument("--server-workers", type=int, default=1, help="API processes")
    ap.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a COMERA_ setting for the API process (repeatable), e.g. COMERA_API_THREADS=8",
    )
    args = ap.parse_args()

    name = f"comera_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(
        "postgresql+psycopg://" + PG.removeprefix("postgresql://"), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db = PG.rsplit("/", 1)[0] + f"/{name}"
    port, home = _free_port(), Path(f"/tmp/{name}")
    queue = f"bench.{name}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    env.update(
        COMERA_DATABASE_URL=db,
        COMERA_BROKER_URL="redis://127.0.0.1:6379/13",
        COMERA_QUEUE=queue,
        COMERA_HOME=str(home),
        COMERA_MAX_QUEUED_JOBS_PER_TENANT="100000",
        COMERA_RATE_LIMIT_PER_MINUTE="0",
    )  # one key, 100 clients: no rate limit
    env.update(item.split("=", 1) for item in args.server_env)
    proc = None
    try:
        upgrade(db)
        key = subprocess.run(
            [sys.executable, "-m", "service.cli", "keys", "create", "--tenant", "bench"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        cmd = [
            sys.executable,
            "-m",
            "service.cli",
            "api",
            "--port",
            str(port),
            "--workers",
            str(args.server_workers),
            "--no-access-log",
        ]
        home.mkdir(parents=True, exist_ok=True)
        log = home / "api.log"
        proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT
        )
        print(f"API log: {log}", flush=True)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc)
        load0 = os.getloadavg()
        results = asyncio.run(_drive(url, key, args, proc.pid))
        load1 = os.getloadavg()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        import redis

        redis.Redis.from_url("redis://127.0.0.1:6379/13").delete(queue)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    closed = results["get_closed_loop"]
    payload = {
        "benchmark": "api_load",
        "machine": machine_info(),
        "database": "postgresql",
        "broker": "redis",
        "server_workers": args.server_workers,
        "server_env": dict(item.split("=", 1) for item in args.server_env),
        "clients": args.clients,
        "client_connections": "one shared pool" if args.shared_pool else "one per client",
        "seconds_per_phase": args.seconds,
        "jobs_stored": args.jobs + 3,
        "load_avg_before": load0,
        "load_avg_after": load1,
        "target": {
            "get_p99_ms_open_loop": TARGET_GET_P99_MS,
            "concurrent_share_of_one_client_throughput": MIN_CONCURRENT_SHARE,
        },
        "results": results,
        "checks": {
            "concurrent_get_throughput_at_least_share_of_one_client": closed["share"]
            >= MIN_CONCURRENT_SHARE,
            "get_p99_open_loop_under_target": results["get_open_loop"]["p99_ms"]
            < TARGET_GET_P99_MS,
        },
        "get_retries_after_closed_keepalive": RETRIES["get"],
        "post_retries_after_closed_keepalive": RETRIES["post"],
    }
    print(f"wrote {write_json('api_load', payload)}")


if __name__ == "__main__":
    main()
