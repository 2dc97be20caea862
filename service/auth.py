"""API keys: format, hashing, scopes, the per-process cache and the per-key rate limit.

A key reads ``cmr_<prefix>_<secret>``: ``prefix`` (8 characters) tells keys apart in listings,
``secret`` is 32 random bytes. The store keeps only ``sha256(key)`` (design b.6), so a key is
shown once, when it is created, and never again; nothing here logs one.

Scopes (design b.1): ``jobs:read`` (GET and HEAD), ``jobs:write`` (every other method),
``artifacts:read`` (checkpoint content, manifests and reports) and ``admin`` (all of them,
plus key management). The checks are pure functions of a ``Principal``, so the FastAPI
dependencies in ``service.api.deps`` stay thin.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["ALL_SCOPES", "DEFAULT_SCOPES", "KeyCache", "NewKey", "Principal", "RateLimiter",
           "hash_key", "looks_like_key", "new_key", "required_scope",
           "validate_scopes"]  # fmt: skip

KEY_PREFIX = "cmr_"
SCOPES = ("jobs:read", "jobs:write", "artifacts:read", "admin")
ALL_SCOPES = frozenset(SCOPES)
DEFAULT_SCOPES = ("jobs:read", "jobs:write", "artifacts:read")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_KEY_CHARS = 128


@dataclass(frozen=True)
class NewKey:
    """A freshly made key: ``plaintext`` goes to the user once; the rest is stored."""

    plaintext: str
    prefix: str
    key_hash: str


@dataclass(frozen=True)
class Principal:
    """Who is asking: the key's id and prefix, its tenant and its scopes."""

    key_id: str
    prefix: str
    tenant_id: str
    tenant_name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


def hash_key(key: str) -> str:
    """The stored form of a key: sha256 hex of its UTF-8 bytes."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> NewKey:
    prefix = secrets.token_hex(4)  # 8 hex characters
    plaintext = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    return NewKey(plaintext=plaintext, prefix=prefix, key_hash=hash_key(plaintext))


def looks_like_key(value: str) -> bool:
    """A cheap shape check before any lookup (rejects junk without touching the store)."""
    return (value.startswith(KEY_PREFIX) and len(value) <= _MAX_KEY_CHARS
            and value.isascii() and value.count("_") >= 2)  # fmt: skip


def validate_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    """``scopes`` deduplicated in canonical order; an unknown scope is a ``ValueError``."""
    given = set(scopes)
    unknown = sorted(given - ALL_SCOPES)
    if unknown:
        raise ValueError(f"unknown scope(s) {unknown}; known: {list(SCOPES)}")
    if not given:
        raise ValueError("a key needs at least one scope")
    return tuple(s for s in SCOPES if s in given)


def required_scope(method: str) -> str:
    """The scope a request needs by its method (routes may demand more)."""
    return "jobs:read" if method.upper() in SAFE_METHODS else "jobs:write"


class KeyCache:
    """``key hash -> Principal`` for ``ttl`` seconds, so a request costs no query.

    A revoked key stops working within ``ttl`` (in every API process, each with its own
    cache). Misses are not cached: an unknown key always reaches the store."""

    def __init__(self, ttl: float = 30.0, max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._items: dict[str, tuple[Principal, float]] = {}

    def get(self, key_hash: str) -> Principal | None:
        hit = self._items.get(key_hash)
        if hit is None or hit[1] < time.monotonic():
            return None
        return hit[0]

    def put(self, key_hash: str, principal: Principal) -> None:
        if len(self._items) >= self.max_entries:
            self._items.clear()  # crude, and bounded: a flood of keys cannot grow memory
        self._items[key_hash] = (principal, time.monotonic() + self.ttl)

    def clear(self) -> None:
        self._items.clear()


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
class RateLimiter:
    """A token bucket per key: ``per_minute`` requests a minute on average, bursts up to
    ``burst``. ``take`` returns 0.0 when the request may pass, else the seconds to wait.

    Per API process: with ``--workers N`` a key gets up to N times the rate (stated in the
    README; a shared limit would need Redis on every request)."""

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
                if len(self._buckets) >= 100_000:
                    self._buckets.clear()
                b = self._buckets[key] = _Bucket(tokens=float(self.burst), stamp=now)
            b.tokens = min(float(self.burst), b.tokens + (now - b.stamp) * rate)
            b.stamp = now
            if b.tokens >= 1.0:
                b.tokens -= 1.0
                return 0.0
            return (1.0 - b.tokens) / rate

    @staticmethod
    def retry_after(wait: float) -> str:
        """``Retry-After`` in whole seconds, at least 1."""
        return str(max(1, math.ceil(wait)))
