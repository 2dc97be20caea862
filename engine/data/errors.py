"""The one error a data loader raises for bad input: where it is and what was expected.

Every loader reports a malformed row as ``DataError(path, line, message)`` and never skips it:
``str(err)`` reads ``"train.tsv:17: expected 40 tab-separated fields, got 39"``. ``line`` is the
1-based line number of the row's first physical line in text files and the 0-based row index in
NPZ arrays (``unit="row"``); ``line=None`` means the file as a whole (missing key, bad header).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DataError"]


class DataError(ValueError):
    """A malformed input: ``path``, ``line`` (or row) and a message saying what was expected."""

    def __init__(
        self, path: str | Path, line: int | None, message: str, *, unit: str = "line"
    ) -> None:
        self.path = str(path)
        self.line = line
        self.unit = unit
        self.message = message
        where = (
            self.path
            if line is None
            else (f"{self.path}:{line}" if unit == "line" else f"{self.path}: {unit} {line}")
        )
        super().__init__(f"{where}: {message}")

    def __reduce__(self):  # keep the attributes through multiprocessing / copy
        return (_rebuild, (self.path, self.line, self.message, self.unit))


def _rebuild(path: str, line: int | None, message: str, unit: str) -> DataError:
    return DataError(path, line, message, unit=unit)
