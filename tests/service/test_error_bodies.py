"""Bounded error bodies, produced off the event loop (docs/input-limits.md#request-bodies; before
these limits an 870 KB body with 40,000 bad label keys got a 5.9 MB 422 in 1.2-1.5 s while
``/v1/healthz`` waited 1.0-1.3 s)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.errors import MAX_ERRORS
from service.main import create_app
from service.request_body import SMALL_BODY_BYTES
from service.store.auth import ALL_SCOPES
from service.store.db.crud.api_keys import create_key
from service.store.db.session import make_engine, make_sessionmaker
from service.store.settings import Settings
from tests.helpers.services import ROOT, free_port
from tests.service.api_helpers import issue_key, job_body

# a healthz call delayed more than this (s) over the quiet median means a rejection held the
# event loop: the old code held it 1-2.5 s per body; scheduling noise stayed under 0.25 s
LOOP_HELD = 0.5

BAD_LABELS = 40_000


def _bad_labels(n: int, prefix: str = "bad key ") -> dict[str, str]:
    return {f"{prefix}{i}": "v" for i in range(n)}  # a space is not allowed in a label key


def _body(n: int, prefix: str = "bad key ") -> bytes:
    return json.dumps(job_body(labels=_bad_labels(n, prefix))).encode()


@pytest.fixture
def client(sqlite_url: str, tmp_path: Path) -> Iterator[TestClient]:
    """The app with the default 1 MiB body limit (the shared fixture allows 16 KiB)."""
    settings = Settings(home=tmp_path / "home", database_url=sqlite_url, broker_url="memory://")
    app = create_app(settings)
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {issue_key(app)}"
        c.headers["Idempotency-Key"] = "k1"
        c.headers["content-type"] = "application/json"
        yield c


def _check_bounded(resp: httpx.Response, total: int, first: str = "/labels/bad key 0") -> None:
    assert resp.status_code == 422 and len(resp.content) < 20_000, len(resp.content)
    problem = resp.json()
    assert len(problem["errors"]) == min(total, MAX_ERRORS)
    assert problem["errors"][0]["pointer"] == first
    if total > MAX_ERRORS:
        assert problem["error_count"] == total
        assert problem["detail"].startswith(f"{total} invalid fields: {first}, ")
        assert problem["detail"].endswith(f"and {total - 10} more")
    else:
        assert "error_count" not in problem


def test_a_422_lists_the_first_100_fields_and_counts_them_all(client: TestClient):
    big = _body(BAD_LABELS)
    assert 800_000 < len(big) < 1_000_000  # the issue's 870 KB, checked in the child process
    _check_bounded(client.post("/v1/jobs", content=big), BAD_LABELS)
    _check_bounded(client.post("/v1/jobs:validate", content=big), BAD_LABELS)
    small = _body(250, "k ")  # checked in the request's thread
    assert len(small) < SMALL_BODY_BYTES
    _check_bounded(client.post("/v1/jobs", content=small), 250, "/labels/k 0")
    _check_bounded(client.post("/v1/jobs", content=_body(7)), 7)
    job = client.get("/v1/jobs").json()["items"]
    assert job == []  # nothing stored
    resp = client.post("/v1/jobs", content=b'{"name": ' + b"[" * 100 + b"]" * 100 + b"}")
    assert resp.status_code == 400 and "deeper than 64" in resp.json()["errors"][0]["message"]


def test_patch_cancel_and_retry_bodies_are_bounded_too(client: TestClient, sqlite_url: str):
    job_id = client.post("/v1/jobs", json=job_body()).json()["id"]
    etag = client.get(f"/v1/jobs/{job_id}").headers["etag"]
    patch = json.dumps({"labels": _bad_labels(BAD_LABELS)}).encode()
    _check_bounded(
        client.patch(f"/v1/jobs/{job_id}", content=patch, headers={"If-Match": etag}), BAD_LABELS
    )
    extra = json.dumps({f"x{i}": 1 for i in range(BAD_LABELS)}).encode()
    for action in ("cancel", "retry"):
        resp = client.post(f"/v1/jobs/{job_id}/{action}", content=extra)
        _check_bounded(resp, BAD_LABELS, "/x0")
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200  # no body: allowed


@pytest.fixture
def server(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``comera api``'s app under uvicorn in its own process (its own GIL): (url, key)."""
    with make_sessionmaker(make_engine(sqlite_url))() as session:
        key = create_key(session=session, tenant="t", scopes=ALL_SCOPES)[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMERA_")}
    env.update(
        COMERA_HOME=str(tmp_path / "home"),
        COMERA_DATABASE_URL=sqlite_url,
        COMERA_BROKER_URL="memory://",
    )
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "service.main:create_app"]
    cmd += ["--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v1/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url, key
    finally:
        proc.terminate()
        proc.wait(30)


def _poll(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=url) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            assert c.get("/v1/healthz").status_code == 200
            out.append(time.perf_counter() - t0)
            time.sleep(0.005)


def _round(url: str, headers: dict[str, str], big: bytes, n: int) -> tuple[float, list[float]]:
    """Two clients each send one huge bad body while a third polls ``/v1/healthz`` every
    5 ms: (seconds until both were answered, healthz latencies)."""
    busy: list[float] = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(url, stop, busy))
    poller.start()
    time.sleep(0.2)
    answers: list[httpx.Response] = []

    def send(key: str) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
            answers.append(c.post("/v1/jobs", content=big, headers={"Idempotency-Key": key}))

    senders = [threading.Thread(target=send, args=(f"{n}.{i}",)) for i in range(2)]
    started = time.perf_counter()
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    took = time.perf_counter() - started
    time.sleep(0.2)
    stop.set()
    poller.join()
    assert len(answers) == 2 and len(busy) > 20
    for resp in answers:
        _check_bounded(resp, BAD_LABELS)
    return took, busy


def test_healthz_is_not_delayed_while_huge_bad_bodies_are_rejected(server):
    """The old code held the event loop for 1-2.5 s per body in every round. This shared
    2-core host also delays a quiet server now and then (other processes): 50-140 ms, and
    100-220 ms in every one of four rounds on a slow day beside the rest of the suite. So up
    to four rounds are run and one must keep every healthz call within :data:`LOOP_HELD` of
    the quiet median: a rejection that blocked the loop would fail them all."""
    url, key = server
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    big = _body(BAD_LABELS)
    with httpx.Client(base_url=url, headers=headers, timeout=120) as c:  # first-use imports
        c.post("/v1/jobs", content=b"{}", headers={"Idempotency-Key": "w"})
        c.post("/v1/jobs", content=big, headers={"Idempotency-Key": "w"})  # the child starts
    quiet: list[float] = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(url, stop, quiet))
    poller.start()
    time.sleep(1.0)
    stop.set()
    poller.join()
    base, rounds = statistics.median(quiet), []
    for n in range(4):
        took, busy = _round(url, headers, big, n)
        rounds.append(
            f"round {n}: 2 bodies of {len(big)} bytes rejected in {took:.1f} s, healthz "
            f"{len(busy)} calls, median {statistics.median(busy) * 1e3:.1f} ms, "
            f"max {max(busy) * 1e3:.1f} ms (quiet median {base * 1e3:.1f} ms)"
        )
        print(rounds[-1])
        if max(busy) - base <= LOOP_HELD:
            break
    assert max(busy) - base <= LOOP_HELD, rounds
