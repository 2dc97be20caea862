"""A training rank that holds at one step until the stop file appears: the entry point of the
preemption test's ranks (``python -m tests.worker.held_rank`` in place of ``python -m
engine.train`` under ``torchrun``).

Every rank, on its progress event of step ``COMERA_TEST_HOLD_AT_STEP``, waits (at most
:data:`HOLD_SECONDS`) until the ``--stop-file`` of its command line exists, then trains on.
The stop therefore arrives mid-run however slowly the test's side thread, the worker's poll or
the machine run: the ranks cannot end before the worker asks them to stop."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from engine.train import cli
from engine.train.callbacks import Callback

HOLD_SECONDS = 120.0


class HoldAt(Callback):
    def __init__(self, step: int, stop_file: Path) -> None:
        self.step, self.stop_file = step, stop_file

    def on_progress(self, event: dict[str, Any]) -> None:
        if event.get("step") != self.step:
            return
        deadline = time.monotonic() + HOLD_SECONDS
        while not self.stop_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)


def main(argv: list[str]) -> int:
    hold = HoldAt(int(os.environ["COMERA_TEST_HOLD_AT_STEP"]), Path(_value(argv, "--stop-file")))
    run_job = cli.run_job

    def held(*args: Any, callbacks: list[Callback] | None = None, **kwargs: Any) -> Any:
        return run_job(*args, callbacks=[*(callbacks or []), hold], **kwargs)

    cli.run_job = held
    return cli.main(argv)


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
