"""Metric and rank series (downsampling by row) and the event log as JSON pages and SSE."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import insert

from api_schemas import JobState as S
from service.store.db.crud.jobs import append_event, transition
from service.store.db.models import MetricPoint, RankPoint, utcnow
from tests.service.api_helpers import Api, make_job, parse_sse


def _expected_rows(n: int, m: int) -> list[int]:
    """Brute force: ``m`` evenly spaced row indices out of ``n`` (all when n <= m)."""
    if n <= m:
        return list(range(n))
    return sorted({(i * (n - 1)) // (m - 1) for i in range(m)})


def _metric_points(api: Api, job_id: str, key: str, steps: list[int], stage: str = "s") -> None:
    t0, tenant = utcnow(), api.tenant_id()
    rows = [
        {
            "job_id": job_id,
            "tenant_id": tenant,
            "attempt": 1,
            "key": key,
            "step": st,
            "stage": stage,
            "epoch": st / 10,
            "value": float(st) * 0.5,
            "t": t0 + timedelta(seconds=st),
        }
        for st in steps
    ]
    with api.sessions() as s, s.begin():
        s.execute(insert(MetricPoint), rows)


@pytest.mark.parametrize(
    "n, m", [(1, 2), (7, 7), (8, 7), (100, 2), (1000, 3), (1000, 333), (997, 500)]
)
def test_metric_downsampling_matches_the_brute_force(api_lite: Api, n: int, m: int):
    job_id = make_job(api_lite)
    steps = [3 * i + 1 for i in range(n)]  # uneven start, gaps: rows, not steps, are spaced
    _metric_points(api_lite, job_id, "loss", steps)
    resp = api_lite.client.get(f"/v1/jobs/{job_id}/metrics?keys=loss&max_points={m}")
    assert resp.status_code == 200, resp.text
    (series,) = resp.json()["series"]
    got = [p["step"] for p in series["points"]]
    assert got == [steps[i] for i in _expected_rows(n, m)]
    assert got[0] == steps[0] and got[-1] == steps[-1]
    assert series["total_points"] == n and series["downsampled"] == (n > m)
    assert series["points"][0]["value"] == steps[0] * 0.5


def test_metric_filters_keys_stage_and_steps_on_both_backends(api: Api):
    job_id = make_job(api)
    _metric_points(api, job_id, "loss", list(range(0, 50)), stage="early")
    _metric_points(api, job_id, "loss", list(range(50, 120)), stage="late")
    _metric_points(api, job_id, "accuracy", list(range(0, 120, 10)), stage="early")
    url = f"/v1/jobs/{job_id}/metrics"
    every = api.client.get(url).json()["series"]
    assert [(s["key"], s["total_points"]) for s in every] == [("accuracy", 12), ("loss", 120)]
    late = api.client.get(
        f"{url}?keys=loss,val_loss&stage=late&from_step=60&to_step=99&max_points=11"
    ).json()["series"]
    assert [s["key"] for s in late] == ["loss", "val_loss"]
    assert late[0]["total_points"] == 40 and late[1]["points"] == []
    expected = [60 + i for i in _expected_rows(40, 11)]
    assert [p["step"] for p in late[0]["points"]] == expected
    assert api.client.get(f"{url}?max_points=1").status_code == 422
    assert api.client.get(f"{url}?max_points=5001").status_code == 422
    assert api.client.get("/v1/jobs/job_nope/metrics").status_code == 404


def test_ranks_by_tensor_glob_and_downsampled(api: Api):
    job_id = make_job(api)
    tenant = api.tenant_id()
    rows = [
        {
            "job_id": job_id,
            "tenant_id": tenant,
            "attempt": 1,
            "tensor": name,
            "step": st,
            "stage": "late",
            "kind": "tt_linear",
            "ranks": [1, 8 - st // 10, 1],
            "params": 100 - st,
            "dense": 1000,
            "ratio": 1000 / (100 - st),
            "t": utcnow(),
        }
        for name in ("hidden.0", "hidden.1", "out_x")
        for st in range(0, 50, 5)
    ]
    with api.sessions() as s, s.begin():
        s.execute(insert(RankPoint), rows)
    resp = api.client.get(f"/v1/jobs/{job_id}/ranks?tensor=hidden.*&max_points=4&from_step=5")
    points = resp.json()["points"]
    assert {p["tensor"] for p in points} == {"hidden.0", "hidden.1"}
    assert [p["step"] for p in points if p["tensor"] == "hidden.0"] == [
        5 + 5 * i for i in _expected_rows(9, 4)
    ]
    assert points[0]["ranks"] == [1, 8, 1] and points[0]["kind"] == "tt_linear"
    assert api.client.get(f"/v1/jobs/{job_id}/ranks?tensor=hidden_?").json()["points"] == []


def _events(api: Api, job_id: str, kinds: list[str], *, finish: str | None = None) -> None:
    with api.sessions() as s, s.begin():
        for i, kind in enumerate(kinds):
            append_event(session=s, job_id=job_id, attempt=1, kind=kind, data={"i": i})
        if finish:
            transition(session=s, job_id=job_id, from_states=[S.RUNNING], to_state=S(finish))


def test_events_json_pages_and_kind_filter(api: Api):
    job_id = make_job(api, state="RUNNING")  # event 1: the QUEUED state
    _events(api, job_id, ["stage", "metric", "metric", "log", "rank"])
    url = f"/v1/jobs/{job_id}/events"
    first = api.client.get(f"{url}?limit=4").json()
    assert [e["seq"] for e in first["items"]] == [1, 2, 3, 4] and first["next_cursor"] == "4"
    rest = api.client.get(f"{url}?limit=4&after=4").json()
    assert [e["seq"] for e in rest["items"]] == [5, 6] and rest["next_cursor"] is None
    metrics = api.client.get(f"{url}?kind=metric", headers={"Accept": "application/json"})
    assert [e["data"] for e in metrics.json()["items"]] == [{"i": 1}, {"i": 2}]
    assert api.client.get(f"{url}?kind=bogus").status_code == 422
    assert api.client.get(url, headers={"Accept": "text/html"}).status_code == 406
    assert api.client.get("/v1/jobs/job_x/events").status_code == 404


@pytest.mark.timeout(60)
def test_sse_resumes_from_last_event_id_and_closes_after_the_terminal_state(api: Api):
    job_id = make_job(api, state="RUNNING")
    _events(api, job_id, ["stage", "metric", "metric", "checkpoint"], finish="SUCCEEDED")
    headers = {"Accept": "text/event-stream"}
    with api.client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(resp.read().decode())
    assert [e["id"] for e in events] == [str(i) for i in range(1, 7)]
    assert [e["event"] for e in events] == [
        "state",
        "stage",
        "metric",
        "metric",
        "checkpoint",
        "state",
    ]
    assert events[-1]["data"]["data"]["state"] == "SUCCEEDED" and events[-1]["data"]["seq"] == 6
    resumed = api.client.get(f"/v1/jobs/{job_id}/events", headers={**headers, "Last-Event-ID": "3"})
    assert [e["id"] for e in parse_sse(resumed.text)] == ["4", "5", "6"]
    done = api.client.get(f"/v1/jobs/{job_id}/events", headers={**headers, "Last-Event-ID": "6"})
    assert parse_sse(done.text) == []  # finished and nothing newer: the stream just ends


@pytest.mark.timeout(60)
def test_sse_tails_new_events_until_the_job_finishes(api: Api):
    job_id = make_job(api, state="RUNNING")

    def worker() -> None:  # what a worker does while the client listens
        for kind in ("metric", "metric"):
            time.sleep(0.3)
            _events(api, job_id, [kind])
        time.sleep(0.3)
        _events(api, job_id, [], finish="FAILED")

    thread = threading.Thread(target=worker)
    t0 = time.monotonic()
    thread.start()
    resp = api.client.get(
        f"/v1/jobs/{job_id}/events?after=1", headers={"Accept": "text/event-stream"}
    )
    thread.join()
    events = parse_sse(resp.text)
    assert [(e["id"], e["event"]) for e in events] == [
        ("2", "metric"),
        ("3", "metric"),
        ("4", "state"),
    ]
    assert events[-1]["data"]["data"]["state"] == "FAILED"
    assert time.monotonic() - t0 < 10


@pytest.mark.timeout(60)
def test_sse_sends_keep_alive_comments_while_idle(api_lite: Api, monkeypatch):
    monkeypatch.setattr("service.api.routes.series.PING_S", 0.2)
    job_id = make_job(api_lite, state="RUNNING")
    url, lines, comments = f"/v1/jobs/{job_id}/events?after=1", [], []
    # the job ends once the client has read three keep-alives, not at a fixed time: on a busy
    # machine a timer once ended it before the stream had started (no comment at all)
    with api_lite.client.stream("GET", url, headers={"Accept": "text/event-stream"}) as resp:
        for line in resp.iter_lines():
            lines.append(line)
            if line.startswith(":"):
                comments.append(line)
                if len(comments) == 3:
                    _events(api_lite, job_id, [], finish="FAILED")
    assert len(comments) >= 3  # one every 0.2 s while nothing happened
    assert [e["event"] for e in parse_sse("\n".join(lines))] == ["state"]
