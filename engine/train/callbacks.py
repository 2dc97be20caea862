"""Trainer side effects go through callbacks, never imports (docs/method.md#training-loop).

Every event is a JSON-safe ``dict`` with an ``event`` key, so a callback can write it to a
file, a database or a queue unchanged:

* ``stage_start`` / ``stage_end``: stage index, kind, label, references (L*, S*), timings;
* ``step``: training metrics averaged over the last ``log_every`` steps;
* ``eval``: validation metrics;
* ``ranks``: per-layer stored and active rank vectors, sizes and compression (the rank
  trajectory), emitted at stage boundaries and whenever ranks change;
* ``checkpoint``: path, step, bytes, whether the job was interrupted (``partial``);
* ``progress``: cheap, every step (global step, stage step, stage length when known);
* ``guard``: a verdict of the fidelity guard on a cut (step, sizes before and after, metric,
  decision: ``accept``, ``back_off``, ``stop`` or ``restore``; :mod:`engine.train.prune_events`);
* ``advice``: an early stage its ranks held back (``code: "raise_max_rank"``, the fix, the
  reason; :func:`engine.train.report.early_stage_advice`) or a late stage that kept none of
  its cuts (``"lower_late_lr"``, ``"relax_late_target"``;
  :func:`engine.train.report.late_stage_advice`), also in the stage's report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

__all__ = ["Callback", "CallbackList", "JsonlWriter", "FunctionCallback"]

Event = dict[str, Any]


class Callback:
    """Base class: override the events you need; each gets one event dict."""

    def on_stage_start(self, event: Event) -> None: ...
    def on_stage_end(self, event: Event) -> None: ...
    def on_step(self, event: Event) -> None: ...
    def on_eval(self, event: Event) -> None: ...
    def on_ranks(self, event: Event) -> None: ...
    def on_checkpoint(self, event: Event) -> None: ...
    def on_progress(self, event: Event) -> None: ...
    def on_guard(self, event: Event) -> None: ...
    def on_advice(self, event: Event) -> None: ...


class CallbackList(Callback):
    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks = list(callbacks)

    def emit(self, event: Event) -> None:
        """``cb.on_<event>(event)`` for every callback that has the handler (a callback that
        does not subclass :class:`Callback` need not know every kind of event)."""
        name = f"on_{event['event']}"
        for cb in self.callbacks:
            handler = getattr(cb, name, None)
            if handler is not None:
                handler(event)


class FunctionCallback(Callback):
    """Calls ``fn(event)`` for every event (handy in tests and services)."""

    def __init__(self, fn: Callable[[Event], None]) -> None:
        self.fn = fn

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_"):
            return object.__getattribute__(self, "fn")
        return object.__getattribute__(self, name)


class JsonlWriter(Callback):
    """Appends ``step`` and ``eval`` events to ``metrics.jsonl`` and ``ranks`` to ``ranks.jsonl``.

    Lines are flushed as they are written, so a reader can follow a running job.
    """

    def __init__(self, out_dir: str | Path) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self._metrics: TextIO = open(out / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._ranks: TextIO = open(out / "ranks.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    @staticmethod
    def _write(f: TextIO, event: Event) -> None:
        f.write(json.dumps(event, sort_keys=True) + "\n")
        f.flush()

    def on_step(self, event: Event) -> None:
        self._write(self._metrics, event)

    def on_eval(self, event: Event) -> None:
        self._write(self._metrics, event)

    def on_stage_end(self, event: Event) -> None:
        self._write(self._metrics, event)

    def on_ranks(self, event: Event) -> None:
        self._write(self._ranks, event)

    def close(self) -> None:
        self._metrics.close()
        self._ranks.close()
