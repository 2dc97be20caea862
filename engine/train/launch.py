"""Starting a data-parallel job: ``torchrun`` on one node as a subprocess.

``python -m engine.train --config job.json --out DIR`` with ``training.devices: N`` (or
``--nproc-per-node N``, which overrides it) runs :data:`TORCHRUN` (``torch.distributed.run``,
the module behind ``torchrun``) with ``N`` processes and a standalone rendezvous (a store on a
port the system picks when it binds, under a fresh run id: two jobs on one machine can neither
race for a port nor join each other), each
process running the same CLI inside the process group (``WORLD_SIZE`` is set, so it trains
instead of launching). Rank 0 writes the outputs; ``--events FILE`` makes it append every event
as a JSON line too, which is how a parent process (the Celery worker) follows a job it did not
run itself, and ``--stop-file FILE`` stops every rank at the same step when that file appears
(a graceful cancel or preemption: a partial checkpoint, exit status 3).

A subprocess rather than ``torch.multiprocessing``: a Celery prefork child may not fork
multiprocessing children of its own, and a separate process group keeps a crash of one rank
from taking the worker with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["TORCHRUN", "torchrun_command", "run_torchrun"]

TORCHRUN = "torch.distributed.run"


def torchrun_command(cli_args: Sequence[str], nproc: int) -> list[str]:
    """``python -m torch.distributed.run ... -m engine.train <cli_args>`` on this node.

    ``--standalone``: a c10d store on port 0 (bound by the system, no window between choosing
    a free port and binding it) under a random run id."""
    return [
        sys.executable,
        "-m",
        TORCHRUN,
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "-m",
        "engine.train",
        *cli_args,
    ]


def run_torchrun(cli_args: Sequence[str], nproc: int, *, cwd: Path | None = None) -> int:
    """Run the job on ``nproc`` processes; their exit status (0, 2 for a bad config, ...)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    proc = subprocess.run(torchrun_command(cli_args, nproc), cwd=cwd, env=env, check=False)
    return proc.returncode
