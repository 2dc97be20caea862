"""``comera worker --devices N`` refuses N above the devices of its machine (``service.cli``:
the GPUs when CUDA is available, else the CPU cores)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.services import ROOT, clean_env


def test_comera_worker_refuses_more_devices_than_the_machine_has(tmp_path):
    cores = len(os.sched_getaffinity(0))
    if cores >= 64:
        pytest.skip("this machine has 64 CPU cores or more: --devices allows at most 64")
    env = clean_env(tmp_path, CUDA_VISIBLE_DEVICES="")  # no GPU: the CPU cores count
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "worker", "--devices", str(cores + 1)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"--devices {cores + 1} is more than the {cores} CPU core(s)" in out.stderr
    assert "no CUDA GPU is available" in out.stderr
