"""Prefixed ULIDs (``job_01J…``): unique, and sorted by creation time to the millisecond.

The 80 random bits of every id are fresh from ``os.urandom``: python-ulid's default generator
is monotonic (an id minted in the same millisecond as the previous one is that one + 1), which
would let a tenant holding one id guess the ids minted next to it for other tenants. Ids made
in one millisecond are therefore in random order; nothing sorts on more than the millisecond
(keyset pages order by ``created_at`` first).
"""

from __future__ import annotations

from ulid import PureRandomPolicy, ULIDGenerator

__all__ = ["new_id"]

_generator = ULIDGenerator(policy=PureRandomPolicy())


def new_id(prefix: str) -> str:
    return f"{prefix}_{_generator.generate()}"
