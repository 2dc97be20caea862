"""bench.ddp_step runs on CPU (gloo) as it will on the GPU machine (nccl): both runs finish,
their final losses agree (same global batch, same gradient), and the summary shows the row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.device_summary import summary
from tests.helpers.groups import LAUNCHES

# three Python processes importing torch (the one-process run, then torchrun's two): 14 s
# alone, 31-38 s beside two other test processes on 2 cores, so it runs alone (scripts/test.sh)
pytestmark = [LAUNCHES, pytest.mark.solo]


def test_ddp_step_smoke_on_cpu_and_its_summary_row(tmp_path: Path):
    out = tmp_path / "ddp_step.json"
    cmd = [sys.executable, "-m", "bench.ddp_step", "--device", "cpu", "--steps", "6", "--out"]
    subprocess.run([*cmd, str(out)], check=True, timeout=120, capture_output=True)
    data = json.loads(out.read_text())
    assert data["data_parallel"]["devices"] == 2 and data["one_process"]["devices"] == 1
    assert data["final_loss_gap"] < 1e-5  # the two runs train the same model (no dropout)
    assert data["one_process"]["step_ms_median"] > 0 < data["data_parallel"]["step_ms_median"]
    (tmp_path / "ddp_step.json").write_text(json.dumps(data))
    assert any(line.startswith("ddp_step (cpu") for line in summary(tmp_path))
