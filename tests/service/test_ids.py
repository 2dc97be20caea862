"""Ids (service.store.ids): ids minted in the same millisecond are not consecutive, so one id does
not reveal its neighbours (another tenant's uploads and jobs)."""

from __future__ import annotations

from ulid import ULID

from service.store.ids import new_id


def _parts(ident: str) -> tuple[int, int]:
    """(millisecond, 80-bit random part) of a prefixed ULID."""
    value = int.from_bytes(ULID.from_str(ident.split("_", 1)[1]).bytes, "big")
    return value >> 80, value & ((1 << 80) - 1)


def test_ids_of_one_millisecond_are_not_consecutive():
    ids = [new_id("ds") for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    parts = [_parts(i) for i in ids]
    same_ms = [(a, b) for a, b in zip(parts, parts[1:], strict=False) if a[0] == b[0]]
    assert len(same_ms) > 100  # the loop is fast enough to mint many per millisecond
    steps = [b[1] - a[1] for a, b in same_ms]
    assert sum(1 for s in steps if abs(s) < 1 << 40) == 0, "neighbouring ids are guessable"
    assert any(s < 0 for s in steps)  # random order within a millisecond


def test_ids_sort_by_millisecond():
    first = new_id("job")
    later = [new_id("job") for _ in range(50)]
    assert all(_parts(first)[0] <= _parts(x)[0] for x in later)
    assert first.startswith("job_") and len(first) == 4 + 26
