"""A server-sent events parser (the WHATWG ``text/event-stream`` rules) over lines of text.

Kept separate from the HTTP code so it is easy to test and reuse: feed it the lines of a
response and it yields one ``ServerEvent`` per dispatched event. Comment lines (``:``, the
server's keep-alive) are skipped; ``data`` lines are joined with newlines; ``id`` persists
across events as the last event id (what a reconnect sends as ``Last-Event-ID``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["ServerEvent", "parse_sse"]


@dataclass(frozen=True)
class ServerEvent:
    id: str | None
    event: str
    data: str
    retry: int | None = None


def parse_sse(lines: Iterable[str]) -> Iterator[ServerEvent]:
    """The events in ``lines`` (each without its line terminator)."""
    last_id: str | None = None
    event, data, retry = "", [], None
    for line in lines:
        line = line.rstrip("\r\n")
        if not line:  # blank line: dispatch
            if data:
                yield ServerEvent(last_id, event or "message", "\n".join(data), retry)
            event, data, retry = "", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\x00" not in value:
            last_id = value
        elif name == "retry" and value.isdigit():
            retry = int(value)
    # an event not closed by a blank line (a dropped connection) is discarded, as the spec says
