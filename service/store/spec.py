"""The spec hash of a submission: equal jobs hash equal.

The translation from the wire spec to the engine's job config and back (``to_engine``,
``SpecError``, the name map of engine fields to wire fields) lives in
:mod:`api_schemas.engine_spec`, shared by the API, the worker and ``comera run``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from api_schemas import JobCreate

__all__ = ["canonical_json", "spec_hash"]


def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def spec_hash(spec: JobCreate) -> str:
    """sha256 of the normalized spec (defaults filled), so equal jobs hash equal."""
    return hashlib.sha256(canonical_json(spec.model_dump(mode="json"))).hexdigest()
