"""JSON written by users, parsed with a nesting limit: a JSONL row, ``config.json``, a header.

``json.loads`` recurses once per level of nesting, so a line of 2,000 ``[`` raises
``RecursionError``, which is no ``ValueError`` and reached the client as a bare 500. Here any
document nested deeper than ``MAX_DEPTH`` levels (an array or object counts one level) is a
:class:`JsonTooDeep`, a ``ValueError`` like every other parse failure, so each caller's
``except ValueError`` turns it into its own 4xx naming the file or line.

The depth is measured only when the text has more than ``max_depth`` opening brackets (a
count in C, so an ordinary flat row costs nothing extra), by an iterative walk of the parsed
value; a document too deep for the parser itself is caught as the ``RecursionError``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "JsonTooDeep", "depth", "loads"]

MAX_DEPTH = 64


class JsonTooDeep(ValueError):
    """The document nests arrays and objects deeper than the limit."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(f"nested deeper than {max_depth} levels")


def depth(value: Any) -> int:
    """Levels of arrays and objects in ``value`` (0 for a scalar), without recursion."""
    best, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        best = max(best, d)
        stack.extend((c, d + 1) for c in children if isinstance(c, dict | list))
    return best


def _openings(raw: str | bytes) -> int:
    if isinstance(raw, str):
        return raw.count("[") + raw.count("{")
    return raw.count(b"[") + raw.count(b"{")


def loads(raw: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(raw)``; :class:`JsonTooDeep` past ``max_depth``, ``ValueError`` if invalid."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise JsonTooDeep(max_depth) from None
    if _openings(raw) > max_depth and depth(value) > max_depth:
        raise JsonTooDeep(max_depth)
    return value
