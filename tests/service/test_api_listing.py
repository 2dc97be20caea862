"""Reading jobs: keyset pagination and filters, ETag / 304, PATCH with If-Match."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, update

from service.store.db.models import Job, LatestMetric
from tests.service.api_helpers import Api, issue_key, make_job

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def _walk(api: Api, query: str, limit: int) -> list[str]:
    seen, cursor = [], None
    for _ in range(100):
        url = f"/v1/jobs?limit={limit}{query}" + (f"&cursor={cursor}" if cursor else "")
        resp = api.client.get(url)
        assert resp.status_code == 200, resp.text
        page = resp.json()
        assert len(page["items"]) <= limit
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return seen
    raise AssertionError("pagination did not end")


def test_pagination_walks_every_job_once_newest_first(api: Api):
    ids = []
    for i in range(13):  # groups of equal created_at: the id breaks the tie
        ids.append(make_job(api, name=f"job-{i}", created_at=T0 + timedelta(seconds=i // 3)))
    expected = [
        j
        for _, j in sorted(
            ((T0 + timedelta(seconds=i // 3), j) for i, j in enumerate(ids)), reverse=True
        )
    ]
    for limit in (1, 4, 5, 13, 50):
        assert _walk(api, "", limit) == expected
    first = api.client.get("/v1/jobs?limit=5").json()
    make_job(api, name="newer", created_at=T0 + timedelta(days=1))  # added mid-walk: before
    older = make_job(api, name="older", created_at=T0 - timedelta(days=1))  # and after
    rest = _walk(api, f"&cursor={first['next_cursor']}", 5)
    assert [j["id"] for j in first["items"]] + rest == [*expected, older]


def test_filters_state_labels_name_model_and_dates(api: Api):
    a = make_job(
        api, name="Alpha run", labels={"team": "nlp", "env": "prod"}, state="RUNNING", created_at=T0
    )
    b = make_job(
        api, name="beta", labels={"team": "nlp"}, state="FAILED", created_at=T0 + timedelta(hours=1)
    )
    c = make_job(api, name="gamma alpha", labels={"team": "cv"}, created_at=T0 + timedelta(hours=2))
    ids = lambda q: [j["id"] for j in api.client.get(f"/v1/jobs?{q}").json()["items"]]  # noqa: E731
    assert ids("state=RUNNING,FAILED") == [b, a]
    assert ids("label=team:nlp") == [b, a]
    assert ids("label=team:nlp&label=env:prod") == [a]
    assert ids("q=ALPHA") == [c, a]
    assert ids("q=%25") == []  # LIKE wildcards are literal
    assert ids("model=mlp") == [c, b, a] and ids("model=dlrm") == []
    after = (T0 + timedelta(minutes=30)).isoformat().replace("+", "%2B")
    assert ids(f"created_after={after}") == [c, b]
    assert ids(f"created_before={after}") == [a]


def test_bad_list_parameters(api_lite: Api):
    assert api_lite.client.get("/v1/jobs?cursor=not-a-cursor").status_code == 400
    bad_state = api_lite.client.get("/v1/jobs?state=DONE")
    assert bad_state.status_code == 422
    assert bad_state.json()["errors"][0]["parameter"] == "state"
    assert api_lite.client.get("/v1/jobs?label=nocolon").status_code == 422
    limit = api_lite.client.get("/v1/jobs?limit=201")
    assert limit.status_code == 422 and limit.json()["errors"][0]["parameter"] == "limit"


def test_get_has_etag_304_retry_after_and_latest_metrics(api: Api):
    job_id = make_job(api, state="RUNNING")
    with api.sessions() as s, s.begin():
        s.execute(
            insert(LatestMetric),
            [
                {
                    "job_id": job_id,
                    "tenant_id": api.tenant_id(),
                    "key": "loss",
                    "step": 7,
                    "value": 0.25,
                }
            ],
        )
    resp = api.client.get(f"/v1/jobs/{job_id}")
    etag = resp.headers["etag"]
    assert etag.startswith('W/"1.') and resp.headers["retry-after"] == "5"
    assert resp.json()["latest_metrics"] == {"loss": 0.25}
    cached = api.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": etag})
    assert cached.status_code == 304 and cached.content == b""
    other = api.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": 'W/"9", "8"'})
    assert other.status_code == 200
    with api.sessions() as s, s.begin():  # a worker's progress flush: same version, new tag
        s.execute(update(Job).where(Job.id == job_id).values(progress={"step": 8}))
    moved = api.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved.headers["etag"] != etag
    assert moved.headers["etag"].startswith('W/"1.')
    done = make_job(api, state="SUCCEEDED")
    assert "retry-after" not in api.client.get(f"/v1/jobs/{done}").headers
    assert api.client.get("/v1/jobs/job_unknown").status_code == 404


def test_patch_needs_if_match_and_changes_only_name_and_labels(api: Api):
    job_id = make_job(api, name="old", labels={"a": "1"})
    url = f"/v1/jobs/{job_id}"
    assert api.client.patch(url, json={"name": "new"}).status_code == 428
    stale = api.client.patch(url, json={"name": "new"}, headers={"If-Match": 'W/"7.0"'})
    assert stale.status_code == 412
    etag = api.client.get(url).headers["etag"]
    with api.sessions() as s, s.begin():  # progress moved on since the client read the tag
        s.execute(update(Job).where(Job.id == job_id).values(progress={"step": 8}))
    ok = api.client.patch(
        url, json={"name": "new", "labels": {"b": "2"}}, headers={"If-Match": etag}
    )
    assert ok.status_code == 200 and ok.headers["etag"].startswith('W/"2.')
    assert ok.json()["name"] == "new" and ok.json()["labels"] == {"b": "2"}
    again = api.client.patch(url, json={"name": "newer"}, headers={"If-Match": etag})
    assert again.status_code == 412  # the first PATCH moved the version on
    fresh = {"If-Match": ok.headers["etag"]}
    state = api.client.patch(url, json={"state": "SUCCEEDED"}, headers=fresh)
    assert state.status_code == 422 and state.json()["errors"][0]["pointer"] == "/state"


def test_another_tenants_job_does_not_exist(api: Api):
    from service.store.db.crud.tenants import get_or_create_tenant
    from service.store.db.models import Job

    job_id = make_job(api)
    with api.sessions() as s:
        other = get_or_create_tenant(session=s, name="someone-else").id  # commits
        s.get(Job, job_id).tenant_id = other
        s.commit()
    assert api.client.get(f"/v1/jobs/{job_id}").status_code == 404
    assert api.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 404
    assert api.client.get("/v1/jobs").json()["items"] == []


def test_head_of_a_job_gives_its_headers_without_a_body(api_lite: Api):
    job_id = make_job(api_lite, state="RUNNING")
    got = api_lite.client.get(f"/v1/jobs/{job_id}")
    head = api_lite.client.head(f"/v1/jobs/{job_id}")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["etag"] == got.headers["etag"] and head.headers["retry-after"] == "5"
    assert head.headers["content-type"] == "application/json"
    cached = api_lite.client.head(
        f"/v1/jobs/{job_id}", headers={"If-None-Match": got.headers["etag"]}
    )
    assert cached.status_code == 304
    assert api_lite.client.head("/v1/jobs/job_unknown").status_code == 404
    reader = issue_key(api_lite.client.app, scopes=["jobs:read"])
    as_reader = {"Authorization": f"Bearer {reader}"}
    assert api_lite.client.head(f"/v1/jobs/{job_id}", headers=as_reader).status_code == 200
