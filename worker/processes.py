"""A data-parallel attempt: the engine runs in processes of its own, the worker follows it.

A job of ``training.devices`` N > 1 (one machine) or ``training.nodes`` M > 1 (a Ray cluster)
cannot train inside the Celery task's process: that process is a prefork pool child, which may
not fork multiprocessing children, and one rank's crash must not take the worker with it. So
the task starts the engine's own launcher with :class:`subprocess.Popen`:

* one machine: ``torchrun`` (``engine.train.launch.torchrun_command``, a standalone
  rendezvous) running ``python -m engine.train`` in N processes;
* several machines: the Ray Train driver (``engine.train.ray_launch.driver_command``), which
  connects to the cluster named by ``COMERA_RAY_ADDRESS`` (docs/distributed.md).

Both get the attempt's directory as ``--out``, the engine config as ``--config``, ``--resume``
with the chosen checkpoint, ``--events`` and ``--stop-file``. :func:`supervise` then, every
:data:`POLL_SECONDS`:

1. reads the new complete lines of the events file (rank 0 appends every event as JSON) and
   hands each to the callbacks, so metrics, rank trajectories, checkpoints and stage events
   reach the store exactly as a one-process job's do (``worker.callback.JobCallback``);
2. asks ``should_stop`` (``worker.lease.Stopper``: cancel, lease lost, deadline, SIGTERM to
   the worker) and on a stop creates the stop file: every rank stops at the same step and rank
   0 writes a partial checkpoint. Processes that have not exited ``grace`` seconds later get
   SIGTERM, and SIGKILL ``kill_after`` seconds after that;
3. notes the launcher's descendants (the ranks): ``torchrun`` starts each rank in a session of
   its own, so a signal to the launcher's process group does not reach them. Signals go to the
   group and to every noted process still alive (checked against its start time, so a reused
   pid is never hit).

The launcher runs in a session of its own (a Ctrl-C or ``docker stop`` of the worker reaches
the worker, which stops the job through the stop file), with ``PR_SET_PDEATHSIG`` set to
SIGTERM on Linux: if the worker process dies, the launcher is told, and ``torchrun`` then
stops its ranks. A failure in the worker while it follows the job (a non-finite loss seen by
the callback, Celery's time limit) ends the processes at once (SIGTERM, then SIGKILL).

:class:`Outcome` says how it ended: completed (exit status 0 and rank 0's ``report.json`` says
so), stopped (a stop was asked for) or failed; :meth:`Outcome.error` turns a failure into the
exception the worker classifies (``worker.problems``): an invalid config or bad data (the
engine's exit status 2 and message), out of memory, a storage errno, else the last error line
of the processes' log (``processes.log`` in the attempt's directory).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.data import DataError
from engine.export import ExportInfo
from engine.train import ConfigError, JobConfig
from engine.train.launch import torchrun_command
from engine.train.ray_launch import driver_command, require_ray
from worker.artifacts import publish_dir, sha256_file

__all__ = [
    "POLL_SECONDS",
    "Launch",
    "Outcome",
    "descendants",
    "prepare",
    "published_export",
    "supervise",
    "world_size",
]

POLL_SECONDS = 0.2
SCAN_SECONDS = 1.0  # how often the launcher's descendants are noted
LOG_TAIL_BYTES = 64 * 1024  # of processes.log, read to say why the processes failed
PR_SET_PDEATHSIG = 1
CPU_ALLOC_FAILED = re.compile(r"DefaultCPUAllocator: (?:can't allocate|not enough) memory")
OOM = re.compile(
    r"\b(?:MemoryError|OutOfMemoryError)\b|CUDA out of memory|" + CPU_ALLOC_FAILED.pattern
)
ERRNO = re.compile(r"^(?:\w+\.)*\w*(?:OSError|IOError)\w*: \[Errno (\d+)\] (.*)$")
EXCEPTION = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception)\w*: .+$")


def world_size(config: JobConfig) -> int:
    """Processes of the job: ``training.devices`` x ``training.nodes``."""
    return config.training.devices * config.training.nodes


class ProcessDataError(DataError):
    """Bad data reported by the engine's processes (their message, file and line included)."""

    def __init__(self, text: str) -> None:
        ValueError.__init__(self, text)
        self.path, self.line, self.unit, self.message = "", None, "line", text


@dataclass(frozen=True)
class Launch:
    """What :func:`supervise` starts and where it looks."""

    command: list[str]
    out: Path  # the attempt's directory: rank 0's --out
    events: Path
    stop_file: Path
    log: Path
    env: dict[str, str]

    @property
    def report(self) -> Path:
        return self.out / "report.json"


def prepare(
    config: JobConfig,
    *,
    out: Path,
    resume: Path | None,
    export_extra: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> Launch:
    """Write the engine config into ``out`` and build the launcher's command line (the module
    doc); leftovers of an earlier start of this attempt (events, stop file, report) go."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "job.json"
    path.write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    launch = Launch(
        command=[],
        out=out,
        events=out / "events.jsonl",
        stop_file=out / "stop",
        log=out / "processes.log",
        env=dict(os.environ if env is None else env),
    )
    for stale in (launch.events, launch.stop_file, launch.report):
        stale.unlink(missing_ok=True)
    args = ["--config", str(path), "--out", str(out), "--no-progress"]
    args += ["--events", str(launch.events), "--stop-file", str(launch.stop_file)]
    args += ["--export-extra", json.dumps(dict(export_extra), sort_keys=True)]
    if resume is not None:
        args += ["--resume", str(Path(resume).resolve())]
    devices = config.training.devices
    if config.training.nodes > 1:
        require_ray()  # a ConfigError naming training.nodes where the extra is missing
        command = driver_command(args)
    else:
        command = torchrun_command(args, devices)
    launch.env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // devices)))
    return Launch(command, out, launch.events, launch.stop_file, launch.log, launch.env)


# -- processes --------------------------------------------------------------------------------
def _start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot, ``/proc/PID/stat`` field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def descendants(pid: int) -> dict[int, int]:
    """``{pid: start time}`` of every living descendant of ``pid`` (Linux ``/proc``)."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out: dict[int, int] = {}
    todo = list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        start = _start_time(child)
        if start is not None and child not in out:
            out[child] = start
            todo.extend(parents.get(child, []))
    return out


def _die_with_parent() -> None:
    """In the launcher, before exec: SIGTERM when the worker process dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the lease and the reaper still apply
        pass


class _Tree:
    """The launcher and the processes it started (noted while they live)."""

    def __init__(self, launch: Launch) -> None:
        self.log = open(launch.log, "ab")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            launch.command,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.known: dict[int, int] = {}
        self.last_scan = float("-inf")

    def scan(self, force: bool = False) -> None:
        now = time.monotonic()
        if (force or now - self.last_scan >= SCAN_SECONDS) and sys.platform == "linux":
            self.last_scan = now
            self.known.update(descendants(self.proc.pid))

    def alive(self) -> list[int]:
        """Noted processes still running (the same start time: not a reused pid)."""
        return [pid for pid, start in self.known.items() if _start_time(pid) == start]

    def signal(self, sig: signal.Signals) -> None:
        self.scan(force=True)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass
        for pid in self.alive():
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def wait_all(self, timeout: float) -> bool:
        """Wait until the launcher and every noted process are gone; False at ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not self.alive():
                return True
            time.sleep(0.05)
        return self.proc.poll() is not None and not self.alive()

    def end(self, kill_after: float) -> None:
        """SIGTERM to everything still running, SIGKILL ``kill_after`` seconds later."""
        if self.proc.poll() is None or self.alive():
            self.signal(signal.SIGTERM)
            if not self.wait_all(kill_after):
                self.signal(signal.SIGKILL)
                self.wait_all(10.0)
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)

    def close(self) -> None:
        self.log.close()


class _Events:
    """The new complete lines of the events file, parsed (a half-written line waits)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


# -- the outcome ------------------------------------------------------------------------------
@dataclass
class Outcome:
    """How the processes ended."""

    code: int  # the launcher's exit status
    report: dict[str, Any] | None  # rank 0's report.json, when it wrote one
    stopped: bool  # a stop was asked for
    log: Path

    @property
    def completed(self) -> bool:
        return self.code == 0 and (self.report or {}).get("status") == "completed"

    def error(self) -> Exception:
        """The exception that says why the processes failed (module doc)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            lines = []
        for line in lines:  # the engine's own refusals come first: they say the most
            if line.startswith("error: invalid config: "):
                text = line.removeprefix("error: invalid config: ")
                name, sep, message = text.partition(": ")
                return (
                    ConfigError(name, message) if sep and " " not in name else ConfigError("", text)
                )
            if line.startswith("error: bad data: "):
                return ProcessDataError(line.removeprefix("error: bad data: "))
        for line in reversed(lines):
            if OOM.search(line):
                return MemoryError(line.strip())
            if m := ERRNO.match(line.strip()):
                return OSError(int(m[1]), m[2])
        last = next((ln.strip() for ln in reversed(lines) if EXCEPTION.match(ln.strip())), None)
        why = f": {last}" if last else " (see processes.log in the attempt's directory)"
        return RuntimeError(f"the training processes exited with status {self.code}{why}")


def supervise(
    launch: Launch,
    *,
    callbacks: Iterable[Any],
    should_stop: Callable[[], bool],
    grace: float,
    kill_after: float,
) -> Outcome:
    """Run ``launch`` to its end, following its events and forwarding a stop (module doc).
    ``callbacks``: engine callbacks (``on_<event>`` methods); ``grace``: seconds the processes
    get to stop with a checkpoint after the stop file appears, before SIGTERM; ``kill_after``:
    seconds from SIGTERM to SIGKILL."""
    cbs = list(callbacks)
    events = _Events(launch.events)

    def dispatch() -> None:
        for event in events.read():
            name = f"on_{event['event']}"
            for cb in cbs:
                method = getattr(cb, name, None)
                if method is not None:
                    method(event)

    tree = _Tree(launch)
    stop_at: float | None = None
    sent: list[signal.Signals] = []
    try:
        while tree.proc.poll() is None:
            dispatch()
            tree.scan()
            if stop_at is None and should_stop():
                launch.stop_file.touch()
                stop_at = time.monotonic()
            waited = time.monotonic() - stop_at if stop_at is not None else 0.0
            for sig, after in ((signal.SIGTERM, grace), (signal.SIGKILL, grace + kill_after)):
                if stop_at is not None and sig not in sent and waited > after:
                    tree.signal(sig)  # torchrun passes SIGTERM on to its ranks
                    sent.append(sig)
            time.sleep(POLL_SECONDS)
        tree.end(kill_after)  # a rank left behind by a launcher that died
        dispatch()  # what rank 0 wrote last (the partial checkpoint, the last stage end)
    except BaseException:
        tree.end(min(kill_after, 10.0))
        raise
    finally:
        tree.close()
    report = json.loads(launch.report.read_text()) if launch.report.is_file() else None
    return Outcome(tree.proc.returncode, report, stop_at is not None, launch.log)


def published_export(out: Path) -> ExportInfo:
    """Rank 0's export (``OUT/model``) moved to ``OUT/export``, where a one-process attempt
    writes it, with its manifest; the weights' sha256 is checked against the manifest."""
    final = publish_dir(out / "model", out / "export")
    manifest_path = final / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    weights = final / "model.safetensors"
    digest = sha256_file(weights)
    if digest != manifest["weights"]["sha256"]:
        raise RuntimeError(f"the exported weights do not match their manifest ({digest})")
    return ExportInfo(final, weights, manifest_path, weights.stat().st_size, digest, manifest)
