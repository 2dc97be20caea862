"""How the reaper reaches the process that runs a task: the workers' remote control.

Forced cancellation (``service.store.reaper``, step 2) asks a
:class:`~service.store.reaper.TaskControl` whether a job's task runs in its lease owner's
process (``host:pid``) and signals that process. The implementations:

* :class:`CeleryControl`: broker-wide (Redis), Celery's ``inspect().active()`` and
  ``revoke(terminate=True)``; what deployments use (``comera reaper``, ``comera up`` on Redis
  and the worker's beat task ``comera.reap``);
* :class:`LocalControl`: ``comera up`` with the embedded broker, which has no broadcast: the
  worker processes are this machine's children, and ``/proc`` says whether the lease owner is
  a child of one of them.

The store keeps only the interface (the Protocol, beside the reaper), and the reaper's callers
choose an implementation and pass it in: the store never imports this module
(``tests/test_layering.py``). Of ``service``, this module imports only the store (the Celery
client of ``service.store.queue`` and the settings), so the worker, whose beat task runs the
reaper with :class:`CeleryControl`, may import it too. Nothing here imports torch or the worker
package.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable, Iterable

from service.store.queue import client_app
from service.store.settings import Settings

__all__ = ["CeleryControl", "LocalControl"]

log = logging.getLogger(__name__)


def _owner_pid(owner: str) -> tuple[str, int | None]:
    host, _, pid = owner.rpartition(":")
    return host, int(pid) if pid.isdigit() else None


class CeleryControl:
    """Broker-wide remote control (Redis): ``inspect().active()`` and ``revoke(terminate)``."""

    def __init__(self, settings: Settings, timeout: float = 2.0) -> None:
        self.app, self.timeout = client_app(settings.broker), timeout

    def running(self, task: str, owner: str) -> bool | None:
        host, pid = _owner_pid(owner)
        try:
            replies = self.app.control.inspect(timeout=self.timeout).active() or {}
        except Exception as exc:  # noqa: BLE001 (no broker: no answer)
            log.warning("inspect failed: %s: %s", type(exc).__name__, exc)
            return None
        if any(
            t.get("id") == task and t.get("worker_pid") == pid
            for tasks in replies.values()
            for t in tasks or []
        ):
            return True
        short = host.split(".")[0]
        if any(n.partition("@")[2].split(".")[0] == short for n in replies):
            return False  # the owner's machine answered, and it does not run the task
        return None  # the owner's machine did not answer: do not guess

    def terminate(self, task: str, owner: str, sig: str) -> bool:
        try:
            self.app.control.revoke(task, terminate=True, signal=sig)
        except Exception as exc:  # noqa: BLE001
            log.warning("revoke of %s failed: %s: %s", task, type(exc).__name__, exc)
            return False
        return True


class LocalControl:
    """Embedded mode (a broker without broadcast): the worker processes are this machine's
    children, so the lease owner's pid is checked to be a child of one of them. A live lease
    names the process that claimed the attempt, and a worker child runs one task only."""

    def __init__(self, worker_pids: Callable[[], Iterable[int]]) -> None:
        self.worker_pids = worker_pids

    @staticmethod
    def _parent(pid: int) -> int | None:
        """The parent of a live process (not a zombie), from ``/proc``; None if none."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            return None
        return None if state in ("Z", "X") else int(ppid)

    def running(self, task: str, owner: str) -> bool | None:
        host, pid = _owner_pid(owner)
        if host != socket.gethostname() or pid is None:
            return None
        parent = self._parent(pid)
        return parent is not None and parent in set(self.worker_pids())

    def terminate(self, task: str, owner: str, sig: str) -> bool:
        _, pid = _owner_pid(owner)
        if pid is None or not self.running(task, owner):
            return False
        try:
            os.kill(pid, getattr(signal, sig))
        except OSError:
            return False
        return True
