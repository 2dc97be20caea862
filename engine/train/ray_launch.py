"""Starting a multi-node job: a Ray Train driver as a subprocess (nothing here imports ray).

``python -m engine.train --config job.json --out DIR`` with ``training.nodes > 1`` (or
``--nnodes N``, which overrides it) runs :data:`DRIVER` (:mod:`engine.train.ray_driver`) in a
process of its own, as ``torchrun`` is run for one node (:mod:`engine.train.launch`). The
driver connects to a Ray cluster and runs Ray Train's ``TorchTrainer`` with
``nodes x devices`` workers, each running the same engine code inside the process group Ray
Train set up; rank 0 writes the outputs and the events, as under ``torchrun``.

Settings, each from the command line or else the environment (docs/distributed.md):

* the cluster: ``--ray-address`` / :data:`ADDRESS_ENV` / ``RAY_ADDRESS``; none: a local Ray
  instance started by the driver (one machine: a laptop, a test);
* the shared storage Ray Train persists checkpoints to (a path mounted on every node, or a
  URI such as ``s3://bucket/prefix``): ``--ray-storage`` / :data:`STORAGE_ENV`; none:
  ``DIR/ray`` (enough for one machine only);
* how many times a failed worker group is restarted from the latest checkpoint:
  ``--max-failures`` / :data:`MAX_FAILURES_ENV` (0 when unset).

Ray is an optional extra (``pip install 'comera-service[ray]'``); without it a multi-node job
is a :class:`~engine.train.config.ConfigError` naming ``training.nodes``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.train.config import ConfigError

__all__ = [
    "ADDRESS_ENV",
    "DRIVER",
    "MAX_FAILURES_ENV",
    "STORAGE_ENV",
    "RaySettings",
    "driver_command",
    "ray_installed",
    "require_ray",
    "run_ray_driver",
    "settings",
]

DRIVER = "engine.train.ray_driver"
ADDRESS_ENV = "COMERA_RAY_ADDRESS"
STORAGE_ENV = "COMERA_RAY_STORAGE"
MAX_FAILURES_ENV = "COMERA_RAY_MAX_FAILURES"
EXTRA = "comera-service[ray]"


def ray_installed() -> bool:
    """Whether ``ray`` can be imported here (looked up, not imported: importing takes seconds)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["ray"] is None (blocked)
        return False


def require_ray() -> None:
    """Refuse a multi-node job where the Ray extra is missing."""
    if not ray_installed():
        raise ConfigError(
            "training.nodes",
            f"more than one node runs on Ray Train, which is not installed: install {EXTRA}",
        )


@dataclass(frozen=True)
class RaySettings:
    address: str | None  # None: start a local Ray instance
    storage: str  # RunConfig(storage_path=...): a shared path or a URI
    max_failures: int


def settings(
    *,
    out: Path,
    address: str | None = None,
    storage: str | None = None,
    max_failures: int | None = None,
    env: Mapping[str, str] | None = None,
) -> RaySettings:
    """The driver's settings: a command-line value, else the environment, else the default."""
    env = os.environ if env is None else env
    address = address or env.get(ADDRESS_ENV) or env.get("RAY_ADDRESS") or None
    storage = storage or env.get(STORAGE_ENV) or str(out.resolve() / "ray")
    if max_failures is None:
        raw = env.get(MAX_FAILURES_ENV, "0")
        try:
            max_failures = int(raw)
        except ValueError:
            raise ConfigError(MAX_FAILURES_ENV, f"must be an integer, got {raw!r}") from None
    if not 0 <= max_failures <= 1000:
        raise ConfigError("--max-failures", f"must be within [0, 1000], got {max_failures}")
    if "://" not in storage:  # a path: the workers run elsewhere, with another cwd
        storage = str(Path(storage).resolve())
    return RaySettings(address, storage, max_failures)


def driver_command(cli_args: Sequence[str]) -> list[str]:
    """``python -m engine.train.ray_driver <cli_args>`` (the same arguments as the CLI)."""
    return [sys.executable, "-m", DRIVER, *cli_args]


def run_ray_driver(cli_args: Sequence[str], *, cwd: Path | None = None) -> int:
    """Run the job through Ray Train; the driver's exit status (0, 2 bad config, 3 stopped)."""
    require_ray()
    proc = subprocess.run(driver_command(cli_args), cwd=cwd, check=False)
    return proc.returncode
