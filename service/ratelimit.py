"""The per-key rate limit: a token bucket per API key, in this process or shared in Redis.

A key gets ``per_minute`` requests a minute on average and bursts of up to ``burst``
(``COMERA_RATE_LIMIT_PER_MINUTE`` / ``COMERA_RATE_LIMIT_BURST``; 0 a minute turns the limit
off). ``take`` answers 0.0 when the request may pass, else the seconds until it could, which
the API sends as ``Retry-After`` with a 429.

* :class:`RateLimiter` keeps the buckets in this process. It is the embedded mode's limiter
  (one API process), the fallback of the shared one, and the limit on failed authentication
  per client address (``COMERA_AUTH_FAILURES_PER_MINUTE``, ``service.api.deps``).
* :class:`RedisRateLimiter` keeps each bucket in a Redis hash and updates it in one Lua
  script, with Redis's clock, so every API process of a deployment (``comera api --workers
  N``, several containers) draws from the same bucket: the limit holds per key, not per
  process. One round trip per request. If Redis does not answer, the request is judged by
  the local bucket instead (a per-process limit for as long as Redis is away, never an
  outage of the API), and a warning is logged once per outage.

:func:`make_rate_limiter` picks one from the settings (``COMERA_RATE_LIMIT_STORE``: ``auto``
shares through Redis when the broker is Redis).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.store.settings import Settings

__all__ = ["RateLimiter", "RedisRateLimiter", "make_rate_limiter", "retry_after"]

log = logging.getLogger(__name__)
MAX_LOCAL_KEYS = 100_000  # local buckets kept before the table is reset (bounded memory)


def retry_after(wait: float) -> str:
    """``Retry-After`` in whole seconds, at least 1."""
    return str(max(1, math.ceil(wait)))


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
class RateLimiter:
    """Token buckets in this process (see the module doc)."""

    per_minute: int
    burst: int
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, key: str, now: float | None = None) -> float:
        if self.per_minute <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        rate = self.per_minute / 60.0  # tokens per second
        with self._lock:
            b = self._buckets.get(key)
            if b is None:
                if len(self._buckets) >= MAX_LOCAL_KEYS:
                    self._buckets.clear()
                b = self._buckets[key] = _Bucket(tokens=float(self.burst), stamp=now)
            b.tokens = min(float(self.burst), b.tokens + (now - b.stamp) * rate)
            b.stamp = now
            if b.tokens >= 1.0:
                b.tokens -= 1.0
                return 0.0
            return (1.0 - b.tokens) / rate

    def peek(self, key: str, now: float | None = None) -> float:
        """The wait :meth:`take` would answer now, without taking a token."""
        if self.per_minute <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        rate = self.per_minute / 60.0
        with self._lock:
            b = self._buckets.get(key)
            if b is None:
                return 0.0
            tokens = min(float(self.burst), b.tokens + (now - b.stamp) * rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / rate

    async def take_async(self, key: str) -> float:
        return self.take(key)

    async def aclose(self) -> None:
        return None

    retry_after = staticmethod(retry_after)


# KEYS[1]: the bucket's hash; ARGV: tokens per second, burst, seconds to keep an idle bucket.
# Returns the wait in seconds as a string (a Lua number would be truncated to an integer).
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local b = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = tonumber(b[1]) or burst
local stamp = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.9f', tokens),
           'stamp', string.format('%.6f', now))
redis.call('EXPIRE', KEYS[1], ARGV[3])
return string.format('%.9f', wait)
"""


class RedisRateLimiter:
    """Token buckets in Redis, shared by every API process (see the module doc).

    ``prefix`` namespaces the keys (``{prefix}{api key id}``); an idle bucket expires once it
    would be full again, so Redis holds only the keys used in the last ``burst / rate``
    seconds.
    """

    def __init__(
        self,
        url: str,
        per_minute: int,
        burst: int,
        prefix: str = "comera:ratelimit:",
        timeout: float = 0.25,
    ) -> None:
        from redis import asyncio as aioredis

        self.per_minute, self.burst, self.prefix = per_minute, burst, prefix
        self.local = RateLimiter(per_minute, burst)  # while Redis is away
        self._client: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._script = self._client.register_script(_TAKE)
        self._down = False

    @property
    def _idle_ttl(self) -> int:
        return max(1, math.ceil(self.burst * 60.0 / self.per_minute)) + 1

    async def take_async(self, key: str) -> float:
        if self.per_minute <= 0:
            return 0.0
        rate = self.per_minute / 60.0
        try:
            wait = await self._script(
                keys=[self.prefix + key], args=[repr(rate), self.burst, self._idle_ttl]
            )
        except Exception as exc:  # noqa: BLE001 (any Redis failure: judge locally)
            if not self._down:
                log.warning(
                    "rate limit store unreachable (%s); limiting per process until it answers",
                    type(exc).__name__,
                )
                self._down = True
            return self.local.take(key)
        if self._down:
            log.info("rate limit store reachable again; the limit is shared once more")
            self._down = False
        return float(wait)

    async def aclose(self) -> None:
        await self._client.aclose()

    retry_after = staticmethod(retry_after)


def make_rate_limiter(settings: Settings) -> RateLimiter | RedisRateLimiter:
    """The limiter ``settings`` ask for: ``rate_limit_store`` ``local``, ``redis`` (the
    broker's Redis) or ``auto`` (Redis when the broker is Redis, else local)."""
    per_minute, burst = settings.rate_limit_per_minute, settings.rate_limit_burst
    store, broker = settings.rate_limit_store, settings.broker
    redis_broker = broker.startswith(("redis://", "rediss://"))
    if store == "redis" or (store == "auto" and redis_broker):  # Settings: redis => redis://
        return RedisRateLimiter(broker, per_minute, burst)
    return RateLimiter(per_minute, burst)
