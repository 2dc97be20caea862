"""The process tree from ``/proc`` (Linux): what a service process started, and whether a
process still runs. A test that stops a service checks that nothing it started is left."""

from __future__ import annotations

from pathlib import Path

__all__ = ["alive", "children", "cmdline", "descendants"]


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after ``pid (comm)``: state, ppid, pgrp, ..."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def children() -> dict[int, list[int]]:
    """parent pid -> the pids of its living children (zombies left out)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(entry.name)) and fields[0] != "Z":
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def descendants(pid: int) -> set[int]:
    """Every living process under ``pid``, in whatever session or group it runs."""
    tree, out, todo = children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie waiting for its parent counts as gone)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def cmdline(pid: int) -> str:
    """``pid``'s command line, its arguments joined by spaces ("" once it has exited)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""
