"""API keys: format, hashing, scopes and the per-process cache (rate limit: service.ratelimit).

A key reads ``cmr_<prefix>_<secret>``: ``prefix`` (8 characters) tells keys apart in listings,
``secret`` is 32 random bytes. The store keeps only ``sha256(key)``, so a key is shown once,
when it is created, and never again; nothing here logs one
(docs/service.md#authentication-and-tenancy).

Scopes: ``jobs:read`` (GET and HEAD), ``jobs:write`` (every other method),
``artifacts:read`` (checkpoint content, manifests and reports) and ``admin`` (all of them,
plus key management). The checks are pure functions of a ``Principal``, so the FastAPI
dependencies in ``service.api.deps`` stay thin.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ALL_SCOPES",
    "DEFAULT_SCOPES",
    "KeyCache",
    "NewKey",
    "Principal",
    "hash_key",
    "looks_like_key",
    "new_key",
    "required_scope",
    "validate_scopes",
]

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
    return (
        value.startswith(KEY_PREFIX)
        and len(value) <= _MAX_KEY_CHARS
        and value.isascii()
        and value.count("_") >= 2
    )


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
    cache). Misses are cached too, for ``miss_ttl`` seconds (:meth:`missing`): an unknown key
    sent again and again costs one query per ``miss_ttl``, not one per request."""

    def __init__(self, ttl: float = 30.0, max_entries: int = 10_000, miss_ttl: float = 5.0):
        self.ttl, self.miss_ttl = ttl, miss_ttl
        self.max_entries = max_entries
        self._items: dict[str, tuple[Principal, float]] = {}
        self._misses: dict[str, float] = {}

    def get(self, key_hash: str) -> Principal | None:
        hit = self._items.get(key_hash)
        if hit is None or hit[1] < time.monotonic():
            return None
        return hit[0]

    def put(self, key_hash: str, principal: Principal) -> None:
        if len(self._items) >= self.max_entries:
            self._items.clear()  # crude, and bounded: a flood of keys cannot grow memory
        self._items[key_hash] = (principal, time.monotonic() + self.ttl)

    def missing(self, key_hash: str) -> bool:
        """Whether the store said, less than ``miss_ttl`` seconds ago, that there is no such
        active key."""
        until = self._misses.get(key_hash)
        return until is not None and until >= time.monotonic()

    def put_missing(self, key_hash: str) -> None:
        if self.miss_ttl <= 0:
            return
        if len(self._misses) >= self.max_entries:
            self._misses.clear()
        self._misses[key_hash] = time.monotonic() + self.miss_ttl

    def clear(self) -> None:
        self._items.clear()
        self._misses.clear()
