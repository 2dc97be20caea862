"""Prefixed ULIDs (``job_01J…``): unique, and sorted by creation time."""

from __future__ import annotations

from ulid import ULID

__all__ = ["new_id"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{ULID()}"
