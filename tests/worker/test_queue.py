"""The API's side of the queue (``service.store.queue``): what a message carries, a dead broker."""

from __future__ import annotations

import base64
import json
import random
import shutil
import time
import uuid

import pytest
import redis

from service.cli import worker_command
from service.store.placement import placement, queue_name
from service.store.queue import enqueue, revoke
from service.store.settings import Settings
from tests.helpers.services import RedisServer


def test_enqueue_sends_one_named_message_with_the_job_limits(tmp_path):
    db = random.randint(1, 15)
    queue = f"test.{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path, broker_url=f"redis://127.0.0.1:6379/{db}", queue=queue)
    client = redis.Redis(host="127.0.0.1", port=6379, db=db)
    try:
        assert enqueue(settings=settings, job_id="job_1", attempt=2, max_wall_time_s=600)
        [raw] = client.lrange(queue, 0, -1)
        message = json.loads(raw)
        headers = message["headers"]
        assert (headers["task"], headers["id"]) == ("comera.run_job", "job_1:2")
        assert headers["timelimit"] == [1500, 600]  # hard = soft + 900 s
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        assert (args, kwargs) == (["job_1", 2], {})
        assert revoke(settings, "job_1:2")
    finally:
        for key in client.scan_iter(f"*{queue}*"):  # the queue and its kombu bindings
            client.delete(key)
        client.close()


def test_a_job_goes_to_the_queue_of_its_placement():
    assert placement({"training": {"devices": 2}}) == {"devices": 2, "nodes": 1}
    assert placement({}) == {"devices": 1, "nodes": 1}  # a spec stored before the fields
    assert queue_name("gpu.any", **placement(None)) == "gpu.any"
    assert queue_name("gpu.any", devices=4) == "gpu.any.x4"
    assert queue_name("gpu.any", devices=4, nodes=2) == "gpu.any.n2x4"
    assert queue_name("gpu.any", nodes=3) == "gpu.any.n3x1"


def test_a_worker_for_n_devices_consumes_their_queue(tmp_path):
    settings = Settings(home=tmp_path, queue="gpu.any")
    command = worker_command(settings, devices=2)
    assert command[command.index("--queues") + 1] == "gpu.any.x2"
    command = worker_command(settings)
    assert command[command.index("--queues") + 1] == "gpu.any"


def test_an_unreachable_broker_fails_fast_instead_of_retrying(tmp_path):
    settings = Settings(home=tmp_path, broker_url="redis://127.0.0.1:1/0")  # nothing listens
    t0 = time.monotonic()
    assert enqueue(settings=settings, job_id="job_1", attempt=1, max_wall_time_s=60) is False
    assert revoke(settings, "job_1:1") is False
    assert time.monotonic() - t0 < 5


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")
def test_sending_recovers_when_the_broker_comes_back(tmp_path):
    server = RedisServer()
    settings = Settings(home=tmp_path, broker_url=server.url, queue="q")
    try:
        assert enqueue(settings=settings, job_id="job_1", attempt=1, max_wall_time_s=60)
        server.kill()
        assert not enqueue(settings=settings, job_id="job_1", attempt=2, max_wall_time_s=60)
        server.start()  # back on its port (empty: it keeps nothing)
        assert enqueue(settings=settings, job_id="job_1", attempt=3, max_wall_time_s=60)
        [raw] = redis.Redis(port=server.port).lrange("q", 0, -1)
        assert json.loads(raw)["headers"]["id"] == "job_1:3"
    finally:
        server.kill()


@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")  # kombu's
def test_a_send_that_loses_the_race_to_create_the_embedded_brokers_tables_is_sent_again(tmp_path):
    """Two processes connecting to a new SQLite broker at once: kombu checks for its tables, the
    other process creates ``kombu_queue`` in between, kombu's CREATE TABLE fails. The moment
    between the check and the create is reproduced here: just before kombu creates the table,
    another connection (as the other process would) creates it."""
    import sqlite3

    from sqlalchemy import Table, event

    settings = Settings(home=tmp_path, queue=f"test.{uuid.uuid4().hex[:8]}")  # SQLite broker
    settings.ensure_dirs()
    path = settings.broker.removeprefix("sqla+sqlite:///")
    raced: list[str] = []

    def other_process_first(table, connection, **kw):
        if table.name == "kombu_queue" and not raced:
            raced.append(table.name)
            with sqlite3.connect(path) as other:
                other.execute("CREATE TABLE kombu_queue (id INTEGER PRIMARY KEY, name TEXT)")

    event.listen(Table, "before_create", other_process_first)
    try:
        assert enqueue(settings=settings, job_id="job_1", attempt=1, max_wall_time_s=600)
    finally:
        event.remove(Table, "before_create", other_process_first)
    assert raced == ["kombu_queue"]  # the race happened, and the send went through after it
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM kombu_message").fetchone() == (1,)
