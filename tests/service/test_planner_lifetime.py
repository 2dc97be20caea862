"""The planner's spawned child never outlives the API process, and never holds up its exit.

Each test runs a stand-in for an API process in its own session: it starts the planner's
child through a real plan request, then is stopped the ways a deployment stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.proctree import alive

ROOT = Path(__file__).resolve().parents[2]

# like uvicorn: SIGTERM sets a flag, the main loop returns, the interpreter exits normally
SCRIPT = """
import os, signal, time
from service.planner import default_planner
planner = default_planner()
try:
    planner.plan({})  # a real request: starts the child, which refuses the empty job
except Exception:
    pass
children = planner.pids()
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
print(" ".join(map(str, children)), flush=True)
while not stop:
    time.sleep(0.05)
time.sleep(1.5)  # a graceful shutdown that takes a while (the child died meanwhile)
"""


def _session_left(sid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if alive(int(p))]


@pytest.mark.parametrize("how", ["sigterm_to_the_group", "sigkill"])
def test_the_planner_child_goes_when_the_api_process_goes(how: str):
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        children = [int(p) for p in proc.stdout.readline().split()]
        assert children and all(alive(c) for c in children)
        if how == "sigkill":
            proc.send_signal(signal.SIGKILL)  # no atexit, no clean-up at all
        else:
            os.killpg(proc.pid, signal.SIGTERM)  # the API and its child together
        assert proc.wait(20) is not None  # exits, never held up by the planner
        deadline = time.monotonic() + 15
        while _session_left(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session_left(proc.pid) == []  # no child, no resource tracker left
    finally:
        for pid in _session_left(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait(10)


def test_a_child_that_died_is_replaced_on_the_next_request():
    from service.planner import PlanFailed, Planner

    planner = Planner(processes=1, timeout_s=60)
    try:
        with pytest.raises(PlanFailed):
            planner.plan({})  # the engine refuses an empty job, naming no field
        (first,) = planner.pids()
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(first) and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(PlanFailed):
            planner.plan({})  # answered by a fresh child, not an error
        (second,) = planner.pids()
        assert second != first and alive(second)
    finally:
        planner.close()
    assert not alive(second)


# an API process that exits while its start-up thread (a daemon, as service.main starts it)
# still starts the planner's child
EXIT_WHILE_WARMING = """
import logging, threading, time
from service.planner import default_planner
logging.basicConfig(level=logging.WARNING)
threading.Thread(target=default_planner().warm, daemon=True).start()
time.sleep(0.5)
"""


def test_an_exit_while_the_child_starts_is_quiet():
    """The interpreter exits while ``warm`` starts the child (its pool refuses new work, or
    atexit closes the planner): a shutdown, not a warning with a traceback."""
    out = subprocess.run(
        [sys.executable, "-c", EXIT_WHILE_WARMING],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "could not be started" not in out.stderr and "Traceback" not in out.stderr, out.stderr
