"""Client errors: one exception carrying the server's RFC 9457 problem details.

Every non-2xx answer becomes a ``ComeraError`` with the problem's ``status``, ``title``,
``detail`` and, for validation errors, the ``errors`` list of ``{pointer, message, code}``
(JSON Pointers into the submitted body), so callers and the CLI can name the failing field.
A download whose bytes do not hash to the advertised sha256 is a ``ChecksumMismatch``.
"""

from __future__ import annotations

from typing import Any

import httpx

from api_schemas import FieldError, Problem

__all__ = ["ChecksumMismatch", "ComeraError"]


class ComeraError(Exception):
    """An error answer of the service (``status`` > 0) or of the client itself (``status`` 0)."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str | None = None,
        errors: list[FieldError] | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        self.status, self.title, self.detail = status, title, detail
        self.errors = list(errors or [])
        self.problem = problem or {"status": status, "title": title, "detail": detail}
        super().__init__(str(self))

    @classmethod
    def from_response(cls, response: httpx.Response) -> ComeraError:
        """Parse a problem+json body; anything else keeps the status and the reason phrase."""
        try:
            body = response.json()
            problem = Problem.model_validate(body)
        except ValueError:  # not JSON, or not a problem object (pydantic errors are ValueErrors)
            text = response.text.strip()[:500] or None
            return cls(response.status_code, response.reason_phrase or "Error", text)
        return cls(problem.status, problem.title, problem.detail, problem.errors, body)

    def __str__(self) -> str:
        head = f"{self.status} {self.title}" if self.status else self.title
        if self.detail:
            head += f": {self.detail}"
        lines = [head]
        for e in self.errors:
            where = e.pointer or (f"?{e.parameter}" if e.parameter else "(body)")
            lines.append(f"  {where}: {e.message} [{e.code}]")
        return "\n".join(lines)


class ChecksumMismatch(ComeraError):
    """The downloaded file does not hash to the sha256 the server advertised in its ETag."""

    def __init__(self, path: str, expected: str, actual: str) -> None:
        self.path, self.expected, self.actual = path, expected, actual
        super().__init__(0, "Checksum mismatch", f"{path}: sha256 {actual} != expected {expected}")
