"""The per-key rate limit shared through Redis (``service.ratelimit``), on the real Redis.

Two limiters, or two API apps, stand for two API processes: they draw from one bucket per
key. Without Redis the limit falls back to the local bucket (per process) and says so once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from service.main import create_app
from service.ratelimit import RateLimiter, RedisRateLimiter, make_rate_limiter
from service.store.settings import Settings
from tests.service.api_helpers import issue_key

REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
def prefix():
    """A key prefix of this test's own; its keys are deleted afterwards."""
    p = f"test:ratelimit:{uuid.uuid4().hex}:"
    yield p
    r = redis.Redis.from_url(REDIS)
    for k in r.scan_iter(match=p + "*"):
        r.delete(k)
    r.close()


def _limiters(n: int, prefix: str, per_minute: int, burst: int) -> list[RedisRateLimiter]:
    return [RedisRateLimiter(REDIS, per_minute, burst, prefix=prefix) for _ in range(n)]


def test_two_processes_draw_from_one_bucket(prefix: str):
    async def run() -> list[float]:
        a, b = _limiters(2, prefix, per_minute=60, burst=3)  # 1 token a second
        try:
            waits = [await lim.take_async("key_1") for lim in (a, b, a, b)]
            waits.append(await b.take_async("key_2"))  # another key: its own bucket
            return waits
        finally:
            await a.aclose()
            await b.aclose()

    waits = asyncio.run(run())
    assert waits[:3] == [0.0, 0.0, 0.0]
    # the fourth waits for one token, whichever process asks (less the time the four took)
    assert 0.5 < waits[3] <= 1.0
    assert waits[4] == 0.0


def test_shared_bucket_refills_at_the_stated_rate_and_expires_when_idle(prefix: str):
    async def run() -> tuple[list[float], float, int]:
        (lim,) = _limiters(1, prefix, per_minute=600, burst=2)  # 10 tokens a second
        try:
            first = [await lim.take_async("k") for _ in range(3)]
            await asyncio.sleep(0.5)  # five tokens' worth; the bucket holds two
            again = await lim.take_async("k")
            ttl = redis.Redis.from_url(REDIS).ttl(prefix + "k")
            return first, again, ttl
        finally:
            await lim.aclose()

    first, again, ttl = asyncio.run(run())
    assert first[:2] == [0.0, 0.0] and 0.0 < first[2] <= 0.1  # 0.1 s less the three takes
    assert again == 0.0
    assert 0 < ttl <= 2  # full again after burst / rate = 0.2 s: kept ceil + 1 seconds


def test_without_redis_the_local_bucket_decides_and_says_so_once(
    prefix: str, caplog: pytest.LogCaptureFixture
):
    async def run() -> list[float]:
        lim = RedisRateLimiter("redis://127.0.0.1:1/0", 60, 2, prefix=prefix)
        try:
            return [await lim.take_async("k") for _ in range(3)]
        finally:
            await lim.aclose()

    with caplog.at_level(logging.WARNING, logger="service.ratelimit"):
        waits = asyncio.run(run())
    assert waits[:2] == [0.0, 0.0] and 0.5 < waits[2] <= 1.0  # still limited, per process
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1


def test_the_settings_choose_the_store(tmp_path: Path):
    def make(**kw) -> object:
        return make_rate_limiter(Settings(home=tmp_path, **kw))

    assert type(make()) is RateLimiter  # embedded: SQLite broker, one process
    assert type(make(broker_url=REDIS)) is RedisRateLimiter  # auto: Redis broker shares
    assert type(make(broker_url=REDIS, rate_limit_store="local")) is RateLimiter
    with pytest.raises(ValueError, match="COMERA_RATE_LIMIT_STORE=redis"):
        Settings(home=tmp_path, rate_limit_store="redis")


def test_two_api_apps_on_one_store_share_each_keys_limit(pg_url: str, tmp_path: Path, prefix: str):
    apps = []
    for i in range(2):
        settings = Settings(
            home=tmp_path / f"home{i}",
            database_url=pg_url,
            broker_url=REDIS,
            rate_limit_per_minute=12,  # a token every 5 s
            rate_limit_burst=3,
        )
        apps.append(create_app(settings))
    with TestClient(apps[0]) as one, TestClient(apps[1]) as two:
        for app in apps:  # this test's own keys in Redis
            app.state.rate_limiter.prefix = prefix
        key = issue_key(apps[0])
        for c in (one, two):
            c.headers["Authorization"] = f"Bearer {key}"
        before = time.monotonic()  # the bucket's first draw is after this
        codes = [one.get("/v1/jobs").status_code]
        first_done = time.monotonic()  # ... and before this
        codes += [c.get("/v1/jobs").status_code for c in (two, one)]
        r = two.get("/v1/jobs")
        elapsed = time.monotonic() - before  # at least the time from the first draw to the 4th
        assert codes == [200, 200, 200]
        if elapsed >= 5:  # a token came back before the 4th draw: nothing to see
            pytest.skip(f"four requests took {elapsed:.1f} s, a token's period, on this host")
        # the 4th draw waits 5 s less the time since the first draw, rounded up (at least 1):
        # from ceil(5 - elapsed) to 5, whatever the host's speed
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) in range(max(1, math.ceil(5 - elapsed)), 6)
        assert r.headers["content-type"] == "application/problem+json"
        other = issue_key(apps[1])  # another key is not held back
        assert two.get("/v1/jobs", headers={"Authorization": f"Bearer {other}"}).status_code == 200
        time.sleep(max(0.0, 5.05 - (time.monotonic() - first_done)))  # one token back
        assert one.get("/v1/jobs").status_code == 200
