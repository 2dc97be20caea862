"""An unhandled error is a 500 problem and the connection stays usable
(docs/input-limits.md#request-bodies; before, after one 500 the next request on the same
keep-alive connection was reset once)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from service.main import create_app
from service.store.settings import Settings
from tests.helpers.services import free_port


@pytest.fixture
def server(sqlite_url: str, tmp_path: Path) -> Iterator[int]:
    """A real uvicorn (h11, keep-alive) serving the app plus a route that raises."""
    settings = Settings(home=tmp_path / "home", database_url=sqlite_url, broker_url="memory://")
    app = create_app(settings)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug, with a secret path /srv/secret")

    port = free_port()
    config = uvicorn.Config(app, port=port, http="h11", log_level="critical", lifespan="on")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started
    yield port
    srv.should_exit = True
    thread.join(10)


def _exchange(sock: socket.socket, path: str) -> tuple[int, dict[str, str], bytes]:
    """One GET on an open keep-alive connection: (status, headers, body)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"the server closed the connection ({path})")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"the server closed the connection ({path})")
        body += chunk
    return int(lines[0].split()[1]), headers, body


def test_a_500_keeps_the_connection_and_shows_no_internals(server: int):
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        for _ in range(2):
            status, headers, body = _exchange(sock, "/boom")
            assert status == 500 and headers["content-type"] == "application/problem+json"
            problem = json.loads(body)
            assert problem["detail"] == "Internal server error." and "secret" not in body.decode()
            status, _, body = _exchange(sock, "/v1/healthz")  # the same connection
            assert status == 200 and json.loads(body)["status"] == "ok"
