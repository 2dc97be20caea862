"""Dataset uploads cannot hold the service (service.upload_limits): a stalled upload is dropped
with a 408 and its temporary file removed, a tenant runs a bounded number at once (429), and a
tenant's datasets stay under a storage quota (413). A real uvicorn server on a socket, so an
upload can stall half-way as a hostile client's would."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from service.main import create_app
from service.store.settings import Settings
from service.upload_limits import UploadSlots
from tests.helpers.services import free_port
from tests.service.api_helpers import issue_key

ROWS = b'{"premise": "a", "hypothesis": "b", "label": 0}\n'


@dataclass
class Live:
    url: str
    port: int
    key: str
    settings: Settings

    def upload(self, body: bytes, name: str = "d", **headers: str) -> httpx.Response:
        return httpx.post(
            f"{self.url}/v1/datasets",
            params={"name": name, "format": "jsonl"},
            content=body,
            headers={
                "Authorization": f"Bearer {self.key}",
                "content-type": "application/octet-stream",
                **headers,
            },
            timeout=30,
        )

    def temp_files(self) -> list[Path]:
        return list((self.settings.artifacts / "datasets").glob(".upload-*"))


@pytest.fixture
def live(sqlite_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Live]:
    """The API under uvicorn; ``upload_idle_seconds`` 2, or the test's indirect parameter."""
    settings = Settings(
        home=tmp_path / "home",
        database_url=sqlite_url,
        broker_url="memory://",
        upload_idle_seconds=getattr(request, "param", 2.0),
        max_uploads_per_tenant=1,
        max_dataset_bytes_per_tenant=3000,
    )
    app, port = create_app(settings), free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield Live(f"http://127.0.0.1:{port}", port, issue_key(app), settings)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _stalled_upload(live: Live) -> socket.socket:
    """A chunked upload that sends its headers and one chunk, then nothing."""
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=30)
    head = (
        "POST /v1/datasets?name=slow&format=jsonl HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{live.port}\r\n"
        f"Authorization: Bearer {live.key}\r\n"
        "Content-Type: application/octet-stream\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    sock.sendall(head.encode() + f"{len(ROWS):x}\r\n".encode() + ROWS + b"\r\n")
    return sock


def _answer(sock: socket.socket) -> str:
    """Everything the server sends until it closes the connection (as a 408 does)."""
    parts = []
    while chunk := sock.recv(4096):
        parts.append(chunk)
    return b"".join(parts).decode()


def _receiving(live: Live) -> None:
    deadline = time.monotonic() + 10
    while not live.temp_files():  # the upload is being received
        assert time.monotonic() < deadline, "the upload never started"
        time.sleep(0.05)


def test_a_stalled_upload_is_dropped_with_408_and_its_file_removed(live: Live):
    sock = _stalled_upload(live)
    try:
        _receiving(live)
        t0 = time.monotonic()
        answer = _answer(sock)  # 408 once 2 s pass without data
        assert answer.startswith("HTTP/1.1 408"), answer
        assert "no data for 2 s" in answer and time.monotonic() - t0 < 8
    finally:
        sock.close()
    assert live.temp_files() == []


# a stalled upload holds the slot 10 s: the second upload has that long to be refused
@pytest.mark.parametrize("live", [10.0], indirect=True)
def test_a_tenant_runs_a_bounded_number_of_uploads_at_once(live: Live):
    sock = _stalled_upload(live)  # holds the tenant's one slot until it is dropped
    try:
        _receiving(live)
        busy = live.upload(ROWS, name="second")
        assert busy.status_code == 429 and busy.headers["retry-after"] == "5", busy.text
        assert busy.headers["content-type"] == "application/problem+json"
        assert "At most 1 uploads of one tenant" in busy.json()["detail"]
        assert _answer(sock).startswith("HTTP/1.1 408")
    finally:
        sock.close()
    assert live.upload(ROWS, name="after").status_code == 201  # the slot is free again


def test_the_tenants_storage_quota_is_413(live: Live):
    first = live.upload(ROWS * 40, name="a")  # 1920 bytes of the 3000
    assert first.status_code == 201, first.text
    declared = live.upload(ROWS * 40, name="b")  # Content-Length says it will not fit
    assert declared.status_code == 413 and "storage quota of 3000 bytes" in declared.text
    assert declared.headers["content-type"] == "application/problem+json"
    streamed = live.upload(iter([ROWS * 20, ROWS * 20]), name="c")  # chunked: found mid-way
    assert streamed.status_code == 413 and "storage quota" in streamed.text
    assert live.temp_files() == []
    assert live.upload(ROWS * 10, name="d").status_code == 201  # what fits still goes
    headers = {"Authorization": f"Bearer {live.key}"}
    listed = httpx.get(f"{live.url}/v1/datasets", headers=headers).json()["items"]
    assert sorted(d["name"] for d in listed) == ["a", "d"]
    deleted = httpx.delete(f"{live.url}/v1/datasets/{first.json()['id']}", headers=headers)
    assert deleted.status_code == 204
    assert live.upload(ROWS * 40, name="b").status_code == 201  # room again


def test_upload_slots_per_tenant_and_in_all():
    slots = UploadSlots(per_tenant=2, total=3)
    with slots.hold("a"), slots.hold("a"):
        with pytest.raises(Exception) as busy:
            with slots.hold("a"):
                pass
        assert busy.value.status_code == 429
        with slots.hold("b"):
            with pytest.raises(Exception) as full:
                with slots.hold("c"):
                    pass
            assert full.value.status_code == 429 and "uploads at once" in full.value.detail
    assert slots._open == {}
