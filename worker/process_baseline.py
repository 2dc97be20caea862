"""What a job's process holds before its model and data: the per-process baseline of the memory
plan (:mod:`worker.memory_estimate`), measured once per host when the worker starts.

A job's process holds the interpreter, torch and the engine, and what their first training
step loads (Adam's first step imports torch's compiler stack, about 150 MB), whatever the
model: a few hundred MB that a plan counting only the model's bytes left out. Three figures,
peak resident set sizes in bytes:

* ``process_bytes``: the peak RSS of the smallest job, a process that imports torch and the
  engine and runs a tiny MLP job (:data:`PROBE_JOB`, two steps and its export) in process;
* ``hf_bytes``: what the same process adds when it then builds and trains a tiny model on
  transformers' own classes (the ``hf`` workload imports most of ``transformers``);
* ``launcher_bytes``: ``torchrun``'s launcher (a process that imported
  ``torch.distributed.run``), which a job on several devices of one machine runs beside its
  processes.

:func:`measure_baseline` runs the two probes (``python -m worker.process_baseline`` and
``python -c 'import torch.distributed.run'``) in child processes, in parallel: a few seconds
of CPU. :func:`host_baseline` measures once per host (its boot) and interpreter, keeping the
figures in the temporary directory for the workers that start after. The worker calls it at
start, in its registration thread (:mod:`worker.registration`), and exports the result to the
pool's children forked after it (:data:`ENV`), where :func:`known_baseline` reads it back,
and writes it into its row (``service.store.workers``), where the API's planner reads it. A
planner without it (a child forked before the measurement ended, the API's while no worker
has measured) uses :data:`DEFAULT_BASELINE`: the largest figures measured on Linux x86-64
with torch 2.x on CPU (about 400 MB a process, 72 MB more for ``hf``, 220 MB for the
launcher), rounded up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_BASELINE",
    "ENV",
    "PROBE_JOB",
    "ProcessBaseline",
    "host_baseline",
    "known_baseline",
    "measure_baseline",
]

ENV = "COMERA_PROCESS_BASELINE"  # the measured baseline as JSON, set by the worker at start
MB = 1 << 20


@dataclass(frozen=True)
class ProcessBaseline:
    process_bytes: int
    hf_bytes: int
    launcher_bytes: int
    measured: bool = False  # False: the documented default

    def to_dict(self) -> dict[str, int | bool]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, int | bool]) -> ProcessBaseline:
        return cls(
            **{k: data[k] for k in ("process_bytes", "hf_bytes", "launcher_bytes")},
            measured=bool(data.get("measured", True)),
        )


DEFAULT_BASELINE = ProcessBaseline(
    process_bytes=416 * MB, hf_bytes=96 * MB, launcher_bytes=240 * MB
)

PROBE_JOB = {
    "version": 1,
    "name": "process-baseline",
    "method": "comera",
    "model": {"arch": "mlp", "config": {"hidden": [16]}},
    "data": {
        "kind": "synthetic",
        "generator": "mlp",
        "n_train": 64,
        "n_valid": 16,
        "params": {"shape": [4, 4], "num_classes": 2},
    },
    "compression": {"max_rank": 2, "min_size": 16},
    "schedule": [{"kind": "early", "steps": 2}],
    "training": {"batch_size": 16, "seed": 0, "log_every": 1},
}


def _hwm() -> int:
    """This process's peak resident set size (``VmHWM``), in bytes."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", text)[1]) * 1024  # type: ignore[index]


def _probe_hf() -> None:
    """A tiny BERT on transformers' classes: built, one forward and backward."""
    import torch
    from transformers import AutoModelForMaskedLM, BertConfig

    import engine.models.hf.model  # noqa: F401 (what the hf workload imports)

    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    model = AutoModelForMaskedLM.from_config(config)
    ids = torch.randint(0, 64, (2, 8))  # (B, S)
    model(input_ids=ids, labels=ids).loss.backward()


def _probe() -> dict[str, int]:
    """Run in ``python -m worker.process_baseline``: the tiny job, then the hf probe."""
    from engine.train.cli import run_job
    from engine.train.job import JobConfig

    with tempfile.TemporaryDirectory() as out:
        run_job(JobConfig.from_dict(PROBE_JOB), Path(out))
    process = _hwm()
    try:
        _probe_hf()
    except ImportError:  # transformers is not installed: no hf jobs run here
        return {"process_bytes": process, "hf_bytes": 0}
    return {"process_bytes": process, "hf_bytes": max(0, _hwm() - process)}


_LAUNCHER = (
    "import re, torch.distributed.run; "
    "print(int(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())[1]) * 1024)"
)


def measure_baseline(timeout_s: float = 300) -> ProcessBaseline:
    """This host's baseline, measured in two child processes (module doc); raises
    ``RuntimeError`` when a probe fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    probes = [
        subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for args in (
            [sys.executable, "-m", "worker.process_baseline"],
            [sys.executable, "-c", _LAUNCHER],
        )
    ]
    outputs = []
    try:
        for proc in probes:
            out, err = proc.communicate(timeout=timeout_s)
            if proc.returncode:
                raise RuntimeError(f"the baseline probe failed: {err.decode()[-2000:]}")
            outputs.append(out.decode().strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the baseline probe took more than {timeout_s:.0f} s") from None
    finally:
        for proc in probes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    process = json.loads(outputs[0])
    return ProcessBaseline(
        process_bytes=process["process_bytes"],
        hf_bytes=process["hf_bytes"],
        launcher_bytes=int(outputs[1]),
        measured=True,
    )


def _host_file() -> Path:
    """Where this host (this boot) keeps the figures of this interpreter."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown"
    key = hashlib.sha256(f"{boot} {sys.executable}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"comera-process-baseline-{key}.json"


def host_baseline(timeout_s: float = 300) -> ProcessBaseline:
    """This host's baseline: measured on the first call after the host started (module doc),
    read back after that."""
    file = _host_file()
    try:
        return ProcessBaseline.from_dict(json.loads(file.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        pass
    baseline = measure_baseline(timeout_s)
    partial = file.with_name(f"{file.name}.{os.getpid()}")
    partial.write_text(json.dumps(baseline.to_dict()))
    partial.replace(file)  # atomic: a worker starting meanwhile reads all of it or nothing
    return baseline


def known_baseline() -> ProcessBaseline:
    """The baseline the worker measured at start (:data:`ENV`), else :data:`DEFAULT_BASELINE`."""
    raw = os.environ.get(ENV)
    if not raw:
        return DEFAULT_BASELINE
    try:
        return ProcessBaseline.from_dict(json.loads(raw))
    except (ValueError, TypeError, KeyError):
        return DEFAULT_BASELINE


if __name__ == "__main__":
    print(json.dumps(_probe()))
