"""``tests.helpers.services.stop``, which every test that runs ``comera up`` ends with: a
process that ignores SIGINT past the timeout fails the test with its own stacks in the
message and is killed with everything it started, so a stuck shutdown on CI is diagnosed
from the log alone."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.proctree import alive, descendants
from tests.helpers.services import stop

STUCK = """
import faulthandler, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
faulthandler.register(signal.SIGUSR1, all_threads=True)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)  # as comera up starts its worker
print("ready", flush=True)
def waiting_for_nothing():
    time.sleep(120)
waiting_for_nothing()
"""


def _start(tmp_path: Path, code: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "stuck.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    while "ready" not in log.read_text():
        assert proc.poll() is None, log.read_text()
        time.sleep(0.05)
    return proc, log


def test_a_process_stuck_past_the_timeout_fails_with_its_stacks_and_is_killed(tmp_path):
    proc, log = _start(tmp_path, STUCK)
    started = descendants(proc.pid)
    assert len(started) == 1
    with pytest.raises(AssertionError) as err:
        stop([proc], [log], timeout=1.0)
    assert "did not stop within 1 s of SIGINT" in str(err.value)
    assert "in waiting_for_nothing" in str(err.value)  # its stack, from the log
    assert proc.returncode == -9
    assert not any(alive(pid) for pid in started)  # its own session's child too


def test_a_process_that_stops_passes(tmp_path):
    proc, log = _start(tmp_path, "import time; print('ready', flush=True); time.sleep(120)")
    stop([proc], [log], timeout=10.0)
    assert proc.returncode == -2  # SIGINT's default: KeyboardInterrupt ends it
