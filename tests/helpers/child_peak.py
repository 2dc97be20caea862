"""Peak RSS of real child processes and of every Python process they start (pytest-free).

:func:`start_recorded` starts a command with a ``sitecustomize`` on ``PYTHONPATH`` that, when
each Python interpreter of the tree exits (the job's process; under ``torchrun`` the launcher
and every rank), writes its resident-set high-water mark (``VmHWM`` of ``/proc/self/status``)
and its command line to a file named after its pid. :func:`read_peaks` reads them back. Start
several commands before waiting on any: they run in parallel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessPeak", "read_peaks", "start_recorded"]

_SITECUSTOMIZE = """
import atexit, json, os, re, sys

def _comera_record_peak(directory=os.environ.get("COMERA_PEAK_DIR")):
    text = open("/proc/self/status").read()
    hwm = int(re.search(r"VmHWM:\\s+(\\d+) kB", text)[1]) * 1024
    with open(os.path.join(directory, str(os.getpid())), "w") as f:
        json.dump({"peak_rss": hwm, "argv": sys.argv}, f)

if os.environ.get("COMERA_PEAK_DIR"):
    atexit.register(_comera_record_peak)
"""


@dataclass(frozen=True)
class ProcessPeak:
    peak_rss: int  # bytes
    argv: list[str]

    @property
    def launcher(self) -> bool:
        """Whether this is ``torchrun`` (``torch.distributed.run``) rather than a rank."""
        return any(a.endswith(("distributed/run.py", "torch.distributed.run")) for a in self.argv)


def start_recorded(
    args: list[str], directory: Path, *, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``python args...`` (this interpreter), its Python processes' peaks written under
    ``directory/peaks``, its output to ``directory/output.log``."""
    site, peaks = directory / "site", directory / "peaks"
    site.mkdir(parents=True, exist_ok=True)
    peaks.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    child_env = {**os.environ, **(env or {}), "PYTHONPATH": path, "COMERA_PEAK_DIR": str(peaks)}
    log = (directory / "output.log").open("wb")
    return subprocess.Popen(
        [sys.executable, *args], env=child_env, stdout=log, stderr=subprocess.STDOUT
    )


def read_peaks(directory: Path) -> list[ProcessPeak]:
    """The peaks recorded under ``directory`` (one per Python process that exited normally)."""
    return [
        ProcessPeak(**json.loads(p.read_text())) for p in sorted((directory / "peaks").iterdir())
    ]
