"""``ComeraClient`` against a real ``comera up``: jobs, problems, events and downloads."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlparse

import pytest

from client import ChecksumMismatch, ComeraClient, ComeraError
from tests.client.conftest import SPEC, spec
from tests.client.proxy import DroppingProxy
from tests.helpers.groups import CLIENT

# the package's server starts once (about 5 s) for all tests, in one test process (CLIENT)
pytestmark = [pytest.mark.slow, CLIENT]


def test_submit_get_and_list(client, finished_job):
    sub, final = finished_job.submitted, finished_job.final
    assert sub.id.startswith("job_") and sub.state in ("QUEUED", "STARTING", "RUNNING")
    assert sub.name == SPEC["name"] and sub.labels == {"suite": "client"}
    got = client.get(sub.id)
    assert got.state == "SUCCEEDED" and got.progress.step == 70 == got.progress.total_steps
    assert got.compression["current_ratio"] > 1 and final.finished_at is not None
    by_label = [j.id for j in client.list(labels={"suite": "client"}, state="SUCCEEDED")]
    assert sub.id in by_label
    assert all(j.state == "SUCCEEDED" for j in client.list(state=["SUCCEEDED"]))
    # pages are followed: a page size of 1 still yields every job, newest first
    every = [j.id for j in client.list(page_size=1)]
    assert sub.id in every and len(every) == len(set(every))
    assert list(client.list(labels={"suite": "no-such-label"})) == []


def test_validate_returns_the_plan(client):
    plan = client.validate(SPEC)
    assert plan.total_steps == 70 and plan.layers
    assert plan.params_after < plan.params_before
    assert {layer.kind for layer in plan.layers} <= {"tt_linear", "ttm_embedding"}


def test_errors_carry_the_problem_with_pointers(client):
    bad = spec(
        schedule=[{"kind": "early", "steps": 0}, {"kind": "late", "steps": 5, "target_ratio": 2}]
    )
    with pytest.raises(ComeraError) as err:
        client.submit(bad)
    e = err.value
    assert e.status == 422 and e.problem["status"] == 422
    pointers = {x.pointer for x in e.errors}
    assert {"/schedule/0/steps", "/schedule/1/target_ratio"} <= pointers, pointers
    assert "/schedule/0/steps" in str(e)
    with pytest.raises(ComeraError) as err:
        client.get("job_01NOSUCHJOB000000000000000")
    assert err.value.status == 404 and err.value.title
    with pytest.raises(ComeraError) as err:
        next(client.events("job_01NOSUCHJOB000000000000000"))
    assert err.value.status == 404
    with pytest.raises(ComeraError) as err:  # a bad query parameter is named
        list(client.list(state="SLEEPING"))
    assert err.value.status == 422 and err.value.errors[0].parameter == "state"


def test_events_increase_and_end_with_the_terminal_state(client, finished_job):
    events = list(client.events(finished_job.submitted.id))
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # gap-free, increasing, from 1
    assert events[-1].kind == "state" and events[-1].data["state"] == "SUCCEEDED"
    assert {"state", "stage", "metric"} <= {e.kind for e in events}
    # resuming after an id gives exactly the rest
    middle = len(seqs) // 2
    rest = list(client.events(finished_job.submitted.id, after=middle))
    assert [e.seq for e in rest] == seqs[middle:]
    metrics = [e for e in events if e.kind == "metric"]
    assert all(m.data["step"] >= 1 for m in metrics) and metrics[-1].data["step"] == 70


def test_events_resume_after_a_dropped_connection(server, client, finished_job):
    direct = [e.seq for e in client.events(finished_job.submitted.id)]
    target = urlparse(server.url)
    proxy = DroppingProxy((target.hostname, target.port), cut_after=2500)
    try:
        with ComeraClient(proxy.url, api_key=server.key) as flaky:
            through = [e.seq for e in flaky.events(finished_job.submitted.id)]
    finally:
        proxy.close()
    assert proxy.connections >= 2  # the first was cut mid-stream, the client reconnected
    assert through == direct  # nothing lost, nothing repeated


def _export(client, job_id):
    export = client.export_checkpoint(job_id)
    assert export.sha256 and export.size_bytes
    return export


def test_download_verifies_and_resumes(client, finished_job, tmp_path: Path):
    job_id = finished_job.submitted.id
    export = _export(client, job_id)
    full = client.download(job_id, tmp_path / "full.safetensors")
    data = full.path.read_bytes()
    assert full.bytes_received == len(data) == export.size_bytes and full.resumed_from == 0
    assert hashlib.sha256(data).hexdigest() == full.sha256 == export.sha256
    # an interrupted download: the first bytes are already there, only the rest is sent
    part = tmp_path / "part.safetensors"
    n = len(data) // 3
    part.write_bytes(data[:n])
    resumed = client.download(job_id, part)
    assert (resumed.resumed_from, resumed.bytes_received) == (n, len(data) - n)
    assert part.read_bytes() == data and not resumed.restarted
    # a complete file is checked, not fetched again
    again = client.download(job_id, part)
    assert again.bytes_received == 0 and again.sha256 == export.sha256


def test_a_corrupt_partial_file_is_discarded_and_downloaded_again(client, finished_job, tmp_path):
    """Chosen behaviour: the final sha256 fails, so the kept prefix was wrong; the client
    throws the part away and downloads the whole file once more."""
    job_id = finished_job.submitted.id
    data = client.download(job_id, tmp_path / "ref").path.read_bytes()
    part = tmp_path / "part"
    n = len(data) // 2
    part.write_bytes(bytes(b ^ 0xFF for b in data[:n]))  # right length, wrong bytes
    result = client.download(job_id, part)
    assert result.restarted and result.resumed_from == 0
    assert result.bytes_received == (len(data) - n) + len(data)
    assert part.read_bytes() == data


def test_a_file_that_does_not_match_its_etag_raises(server, client, finished_job, tmp_path):
    """A server file altered after registration (disk corruption): ``ChecksumMismatch``."""
    job_id = finished_job.submitted.id
    ckpt = next(
        c for c in client.checkpoints(job_id) if c.kind != "export" and c.state == "complete"
    )
    stored = next(
        p
        for p in server.home.rglob("*.safetensors")
        if p.stat().st_size == ckpt.size_bytes
        and hashlib.sha256(p.read_bytes()).hexdigest() == ckpt.sha256
    )
    original = stored.read_bytes()
    stored.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    try:
        with pytest.raises(ChecksumMismatch) as err:
            client.download(job_id, tmp_path / "ckpt", checkpoint_id=ckpt.id)
    finally:
        stored.write_bytes(original)
    assert err.value.expected == ckpt.sha256 and "sha256" in str(err.value)
    assert not (tmp_path / "ckpt").exists()  # a bad file is not left behind


def test_up_prints_its_first_key_once_and_its_logs_never_show_it(
    server, client, finished_job, tmp_path: Path
):
    """The embedded service prints the key it made on first start exactly once; after a job
    ran, was downloaded and a bad key was refused, neither the API nor the worker (same log)
    wrote the key again, whole or its secret part."""
    client.download(finished_job.final.id, tmp_path / "m.safetensors")
    wrong = server.key[:-1] + ("B" if server.key.endswith("A") else "A")  # never the key
    with ComeraClient(server.url, api_key=wrong) as bad:
        with pytest.raises(ComeraError):
            bad.get(finished_job.final.id)
    log = server.log.read_text()
    secret = server.key.split("_", 2)[2]
    assert log.count(server.key) == 1, server.tail()
    assert log.count(secret) == 1
