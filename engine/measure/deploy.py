"""The deployment table of an ``hf`` job: the exported ``model/hf/`` beside the original.

For each of the two models, on the job's device: the task metric on the validation split
(the workload's own evaluation: perplexity and accuracy, accuracy, or cosine to the
original), parameters, bytes of ``model.safetensors``, and for a batch of 1 and a throughput
batch, both at ``seq_len`` tokens: the median forward latency and the peak memory.

The exported model is the directory itself, loaded by transformers with
``trust_remote_code`` (the modeling file this engine wrote, nothing of the user's): what a
user deploys. The original is the pretrained model for a job with ``path``; for a model trained
from a config it is the same model with its TT layers multiplied out (``model/dense/``'s
content): the dense model a user would otherwise ship.

Peak memory: ``torch.cuda.max_memory_allocated`` on CUDA; on the CPU the largest sum of live
tensor storages during the forward (parameters included), tracked by a dispatch mode: every
tensor an operator returns counts until it is freed. Scratch memory inside one operator is not
seen, so the CPU figure is a lower bound of what the allocator holds.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["compare_deploy", "peak_tensor_bytes", "time_forward", "THROUGHPUT_BATCH"]

THROUGHPUT_BATCH = 32
REPEATS = 5


class _LiveStorages(TorchDispatchMode):
    """Bytes of the storages alive among the operators' outputs (base counted once)."""

    def __init__(self, base: int) -> None:
        super().__init__()
        self.current = self.peak = base
        self.refs: dict[int, list[int]] = {}  # data_ptr -> [bytes, tensors alive]

    def _release(self, ptr: int) -> None:
        entry = self.refs.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.refs[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in self.refs:
                self.refs[ptr][1] += 1
            else:
                self.refs[ptr] = [storage.nbytes(), 1]
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
            weakref.finalize(t, self._release, ptr)
        return out


def _state_bytes(model: nn.Module) -> int:
    tensors = {t.data_ptr(): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


@torch.inference_mode()
def peak_tensor_bytes(model: nn.Module, call: Callable[[], Any], device: torch.device) -> int:
    """Peak memory of one ``call()`` (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        call()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    with _LiveStorages(_state_bytes(model)) as mode:
        call()
    return int(mode.peak)


@torch.inference_mode()
def time_forward(
    calls: tuple[Callable[[], Any], ...], device: torch.device, repeats: int = REPEATS
) -> list[float]:
    """Median wall seconds of each of ``calls`` after one warm-up each; the calls alternate,
    so a stall of the host slows them alike."""
    for call in calls:
        call()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for call, seen in zip(calls, times, strict=True):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seen.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _inputs(vocab: int, batch: int, seq_len: int, device: torch.device) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, max(vocab, 6), (batch, seq_len), generator=g).to(device)  # (B, S)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _forward(net: nn.Module, inputs: dict[str, Tensor]) -> Callable[[], Any]:
    return lambda: net(**inputs)


def _rows(
    nets: tuple[nn.Module, ...],
    metrics: tuple[dict[str, float], ...],
    files: tuple[Path | None, ...],
    seq_len: int,
    device: torch.device,
) -> list[dict[str, Any]]:
    rows = [
        {
            "metrics": m,
            "parameters": sum(p.numel() for p in net.parameters()),
            "file_bytes": f.stat().st_size if f is not None and f.is_file() else None,
        }
        for net, m, f in zip(nets, metrics, files, strict=True)
    ]
    vocab = int(nets[0].config.vocab_size)
    for name, batch in (("batch_1", 1), ("throughput", THROUGHPUT_BATCH)):
        inputs = _inputs(vocab, batch, seq_len, device)
        calls = tuple(_forward(net, inputs) for net in nets)
        seconds = time_forward(calls, device)
        for row, net, call, sec in zip(rows, nets, calls, seconds, strict=True):
            row[name] = {
                "batch": batch,
                "latency_ms": round(sec * 1e3, 3),
                "tokens_per_second": round(batch * seq_len / sec, 1),
                "peak_bytes": peak_tensor_bytes(net, call, device),
            }
    return rows


def compare_deploy(
    exported: nn.Module,
    original: nn.Module,
    *,
    metrics: tuple[dict[str, float], dict[str, float]],
    files: tuple[Path | None, Path | None],
    seq_len: int,
    device: torch.device,
) -> dict[str, Any]:
    """The table: ``exported`` and ``original`` rows and their ratios."""
    nets = (exported.to(device).eval(), original.to(device).eval())
    e, o = _rows(nets, metrics, files, seq_len, device)
    rows = {"exported": e, "original": o}
    ratios = {
        "parameters": o["parameters"] / max(e["parameters"], 1),
        "speedup_batch_1": o["batch_1"]["latency_ms"] / max(e["batch_1"]["latency_ms"], 1e-9),
        "speedup_throughput": o["throughput"]["latency_ms"]
        / max(e["throughput"]["latency_ms"], 1e-9),
        "memory_throughput": o["throughput"]["peak_bytes"] / max(e["throughput"]["peak_bytes"], 1),
    }
    if e["file_bytes"] and o["file_bytes"]:
        ratios["file_bytes"] = o["file_bytes"] / e["file_bytes"]
    return {
        "seq_len": seq_len,
        "device": str(device),
        "threads": torch.get_num_threads(),
        **rows,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
    }
