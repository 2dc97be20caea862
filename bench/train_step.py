"""One training step of the six-encoder MNLI transformer: CoMERA vs dense AdamW vs GaLore.

    python -m bench.train_step [--batches 1,8,32] [--quick] [--repeats N]

A step is ``zero_grad``, forward, loss, backward and the optimizer step, in training mode
(dropout on), sequence length 128, random token ids / labels from a fixed seed, token types
0 then 1 (a sentence pair), full attention mask.

* ``comera``: ``build_transformer(mnli, tensorized=True, max_rank=30, shapes="mnli")``,
  AdamW in three groups (TT/TTM cores lr 1e-4, gates 1e-3, others 5e-5, weight decay 0),
  loss ``CE + 0.01 R`` with ``R = GateIndex(model, "cost_weighted").penalty()``.
* ``dense``: the dense model, ``torch.optim.AdamW(lr=1e-4)`` with torch's default settings.
* ``galore``: the dense model, galore-torch's ``GaLoreAdamW`` (lr 1e-4) with the GaLore
  README's groups: the 2-D weights of the encoder linears projected (rank 128, update gap
  200, scale 0.25, ``std``), every other parameter plain. Its SVD refresh runs every 200th
  step, so its time per step is ``(199 * regular + refresh) / 200`` with both kinds timed
  (a refresh step is forced by setting the projected parameters' step counters to the next
  multiple of 200).

Each configuration of a batch size runs in its own worker process (its own allocator, as a
training job would), all alive at once; the parent steps them in turns, round-robin (warm-up
rounds first), so load drift on this shared machine hits all alike. A turn is one untimed
step and one timed step, so that the timed step follows a step of the same model, as in a
training loop (caches hold that model's data, not the previous worker's); the median over
rounds is reported (with its optimizer share). Memory: each worker's peak RSS (``VmHWM``)
over all its steps, minus that of an idle worker with the same imports, inputs and warm-up
(a tiny step of every configuration, so thread pools, lazy imports and kernels cancel).
Every worker gets the same environment (:data:`CHILD_ENV`). Writes
``bench/results/train_step.json`` and prints the ratios against the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.common import machine_info, write_json
from engine.models.transformer import TransformerClassifier, TransformerConfig, build_transformer
from engine.nn.flat import FlatBuffer, flatten_
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.rank.penalty import GateIndex

CONFIGS = ("comera", "dense", "galore")
SEQ, SEED, PENALTY_WEIGHT = 128, 0, 0.01
COMERA_LR = {"cores": 1e-4, "gates": 1e-3, "others": 5e-5}
COMERA_ADAMW: dict = {"fused": True}  # over three flat buffers (engine.nn.flat), see the doc
DENSE_LR = 1e-4
GALORE = {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}
# The allocator of every worker (all alike): jemalloc, as PyTorch's CPU tuning guide advises,
# told to keep freed pages (no purge, so no page faults on reuse); glibc's malloc instead
# fragments (peak RSS 20-50% above the live peak here) or, told to keep memory, more so.
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
JEMALLOC_ENV = {"LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}
CHILD_ENV: dict[str, str] = JEMALLOC_ENV if os.path.exists(JEMALLOC) else {}
TARGETS = {  # ratio >= target
    "dense_over_comera_time": {1: 5.0, 8: 5.0, 32: 4.0},
    "galore_over_comera_time": {1: 6.0, 32: 4.0},
    "galore_over_comera_memory": {1: 12.0, 32: 2.0},
}
AUTHORS_CODE = {  # the authors' released implementation, measured on this machine (issue text)
    "dense_over_comera_time": {1: 3.0, 8: 3.4, 32: 2.5},
    "galore_over_comera_time": {1: 3.5, 8: 3.3, 32: 2.1},
    "galore_over_comera_memory": {1: 8.2, 8: 2.1, 32: 1.2},
}


LEAD_STEPS = 1  # untimed steps before the timed one in each configuration's turn
LOWRANK_FROM_BATCH = 16  # from here on activations dominate memory (module doc)


def comera_config(batch: int) -> TransformerConfig:
    """The CoMERA model's config at ``batch``: TT-linear outputs kept as rank-r factors
    (:mod:`engine.contract.lowrank_saved`) where activations dominate memory."""
    return TransformerConfig.mnli(recompute_tt_outputs=batch >= LOWRANK_FROM_BATCH)


# -- data, models, optimizers ---------------------------------------------------------------
def make_inputs(batch: int, cfg: TransformerConfig) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Token ids (B, S), token types (B, S), attention mask (B, S), labels (B,)."""
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, cfg.vocab_size, (batch, SEQ), generator=g)  # (B, S)
    types = (torch.arange(SEQ) >= SEQ // 2).long().expand(batch, SEQ).contiguous()  # (B, S)
    mask = torch.ones(batch, SEQ, dtype=torch.bool)  # (B, S)
    labels = torch.randint(0, cfg.num_classes, (batch,), generator=g)  # (B,)
    return ids, types, mask, labels


def comera_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """The three CoMERA groups: TT / TTM cores, rank gates, everything else."""
    cores, gates = [], []
    for mod in model.modules():
        if isinstance(mod, TTLinear | TTMEmbedding):
            cores += list(mod.cores)
            gates += list(mod.gates)
    seen = {id(p) for p in cores + gates}
    others = [p for p in model.parameters() if id(p) not in seen]
    return {"cores": cores, "gates": gates, "others": others}


def comera_optimizer(model: nn.Module) -> tuple[torch.optim.Optimizer, list[FlatBuffer]]:
    """AdamW over the three groups, each flattened into one buffer (:mod:`engine.nn.flat`)."""
    flats = {k: flatten_(ps) for k, ps in comera_groups(model).items()}
    groups = [{"params": [f.param], "lr": COMERA_LR[k]} for k, f in flats.items()]
    return torch.optim.AdamW(groups, weight_decay=0.0, **COMERA_ADAMW), list(flats.values())


def galore_groups(model: TransformerClassifier) -> list[dict]:
    """GaLore README groups: encoder ``nn.Linear`` weights projected, the rest plain."""
    projected = [m.weight for m in model.encoder.modules() if isinstance(m, nn.Linear)]
    ids = {id(p) for p in projected}
    regular = [p for p in model.parameters() if id(p) not in ids]
    return [{"params": regular}, {"params": projected, **GALORE}]


@dataclass
class Runner:
    """One configuration: ``step()`` returns (seconds in total, seconds in the optimizer)."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[], Tensor]
    flats: tuple[FlatBuffer, ...] = ()  # flattened parameter groups (CoMERA)

    def step(self) -> tuple[float, float]:
        start = time.perf_counter()
        self.model.zero_grad(set_to_none=True)
        self.loss().backward()
        mid = time.perf_counter()
        for flat in self.flats:
            flat.gather_grad_()
        self.optimizer.step()
        end = time.perf_counter()
        return end - start, end - mid

    def refresh_step(self) -> tuple[float, float]:
        """A GaLore step that recomputes every projection (an SVD per projected weight)."""
        gap = GALORE["update_proj_gap"]
        for group in self.optimizer.param_groups:
            if "rank" in group:
                for p in group["params"]:
                    state = self.optimizer.state[p]
                    state["step"] = -(-state.get("step", 0) // gap) * gap
        return self.step()


def build(name: str, batch: int, cfg: TransformerConfig | None = None) -> Runner:
    """The model, optimizer and loss of configuration ``name`` on the bench inputs."""
    torch.manual_seed(SEED)
    if name == "comera":
        cfg = cfg or comera_config(batch)
        model = build_transformer(cfg, tensorized=True, max_rank=30, shapes="mnli")
    else:
        cfg = cfg or TransformerConfig.mnli()
        model = build_transformer(cfg, tensorized=False)
    model.train()
    ids, types, mask, labels = make_inputs(batch, cfg)
    flats: list[FlatBuffer] = []
    if name == "comera":
        optimizer, flats = comera_optimizer(model)
        index = GateIndex(model, "cost_weighted")

        def loss() -> Tensor:
            ce = F.cross_entropy(model(ids, types, mask), labels)
            return ce + PENALTY_WEIGHT * index.penalty()
    else:
        if name == "dense":
            optimizer = torch.optim.AdamW(model.parameters(), lr=DENSE_LR)
        else:
            from galore_torch import GaLoreAdamW

            optimizer = GaLoreAdamW(galore_groups(model), lr=DENSE_LR,
                                    no_deprecation_warning=True)

        def loss() -> Tensor:
            return F.cross_entropy(model(ids, types, mask), labels)

    return Runner(name, model, optimizer, loss, tuple(flats))


def warm_up() -> None:
    """A tiny step of every configuration: thread pools, lazy imports, kernels, arenas."""
    for name in CONFIGS:
        cfg = TransformerConfig.tiny(max_len=SEQ)
        torch.manual_seed(SEED)
        model = build_transformer(cfg, tensorized=name == "comera", max_rank=4, shapes="auto")
        ids, types, mask, labels = make_inputs(2, cfg)
        flats: list[FlatBuffer] = []
        if name == "comera":
            opt, flats = comera_optimizer(model)
            extra = GateIndex(model, "cost_weighted").penalty()
        elif name == "dense":
            opt, extra = torch.optim.AdamW(model.parameters()), 0.0
        else:
            from galore_torch import GaLoreAdamW

            groups = galore_groups(model)
            groups[1].update(rank=4)
            opt, extra = GaLoreAdamW(groups, no_deprecation_warning=True), 0.0
        (F.cross_entropy(model(ids, types, mask), labels) + extra).backward()
        for flat in flats:
            flat.gather_grad_()
        opt.step()


# -- workers: one process per configuration, stepped in lockstep by the parent ------------
PROTO = "@@"  # prefix of protocol lines on a worker's stdout (libraries may print too)


def vmhwm_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def worker(name: str, batch: int) -> None:
    """Build ``name`` (or nothing for ``idle``), then serve ``step`` / ``refresh`` / ``exit``."""
    torch.manual_seed(SEED)
    make_inputs(batch, TransformerConfig.mnli())
    warm_up()
    runner = None if name == "idle" else build(name, batch)

    def say(obj: dict) -> None:
        sys.stdout.write(PROTO + json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"ready": True})
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "exit":
            break
        if runner is None:
            raise RuntimeError(f"the idle worker cannot {cmd}")
        t, o = runner.refresh_step() if cmd == "refresh" else runner.step()
        say({"s": t, "opt_s": o})
    say({"vmhwm_kib": vmhwm_kib()})


class Worker:
    """Parent side of a worker process."""

    def __init__(self, name: str, batch: int) -> None:
        self.name = name
        self.err = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "bench.train_step", "--worker", name, "--batch", str(batch)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True, env={**os.environ, **CHILD_ENV})

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PROTO):
                return json.loads(line[len(PROTO):])
        self.err.seek(0)
        raise RuntimeError(f"worker {self.name} died:\n{self.err.read()[-4000:]}")

    def send(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> int:
        out = self.send("exit")["vmhwm_kib"]
        self.proc.wait()
        return out


# -- parent ---------------------------------------------------------------------------------
def measure_batch(batch: int, quick: bool, repeats: int | None, idle_kib: int) -> dict:
    if repeats is None:
        repeats = 3 if quick else {1: 9, 8: 7}.get(batch, 5)
    warmup = 1 if quick or batch >= 32 else 2
    refreshes = 1 if quick or batch >= 32 else 2
    workers = {name: Worker(name, batch) for name in CONFIGS}
    for w in workers.values():
        w.read()  # ready
    for _ in range(warmup):
        for w in workers.values():
            w.send("step")
    samples: dict[str, list[dict]] = {k: [] for k in (*CONFIGS, "galore_refresh")}
    for i in range(repeats):
        for name, w in workers.items():
            for _ in range(LEAD_STEPS):  # the turn starts as a training loop runs: warm caches
                w.send("step")
            samples[name].append(w.send("step"))
        if i < refreshes:
            samples["galore_refresh"].append(workers["galore"].send("refresh"))
    mem = {name: (w.close() - idle_kib) / 1024 for name, w in workers.items()}
    med = {k: statistics.median(x["s"] for x in v) for k, v in samples.items()}
    opt = {k: statistics.median(x["opt_s"] for x in v) * 1e3 for k, v in samples.items()}
    gap = GALORE["update_proj_gap"]
    galore = ((gap - 1) * med["galore"] + med["galore_refresh"]) / gap
    step_ms = {"comera": med["comera"] * 1e3, "dense": med["dense"] * 1e3,
               "galore": galore * 1e3}  # fmt: skip
    ratios = {
        "dense_over_comera_time": step_ms["dense"] / step_ms["comera"],
        "galore_over_comera_time": step_ms["galore"] / step_ms["comera"],
        "galore_over_comera_memory": mem["galore"] / mem["comera"],
        "dense_over_comera_memory": mem["dense"] / mem["comera"],
    }
    return {
        "batch": batch,
        "step_ms": step_ms,
        "peak_mib": mem,
        "ratios": ratios,
        "optimizer_ms": opt,
        "galore_regular_ms": med["galore"] * 1e3,
        "galore_refresh_ms": med["galore_refresh"] * 1e3,
        "rounds": {"warmup": warmup, "timed": repeats, "untimed_lead_steps": LEAD_STEPS,
                   "galore_refresh": refreshes},
        "comera_config": comera_config(batch).to_dict(),
        "samples_ms": {k: [x["s"] * 1e3 for x in v] for k, v in samples.items()},
    }


def table(rows: list[dict]) -> str:
    lines = [f"{'batch':>5} {'config':<7} {'step ms':>9} {'opt ms':>8} {'peak MiB':>9}"]
    for r in rows:
        for name in CONFIGS:
            lines.append(f"{r['batch']:>5} {name:<7} {r['step_ms'][name]:>9.1f} "
                         f"{r['optimizer_ms'][name]:>8.1f} {r['peak_mib'][name]:>9.1f}")
    lines.append("")
    lines.append(f"{'ratio':<27} {'batch':>5} {'got':>7} {'target':>7} {'authors':>8}")
    for key in TARGETS:
        for r in rows:
            b = r["batch"]
            target = TARGETS[key].get(b)
            mark = "" if target is None else ("  ok" if r["ratios"][key] >= target else "  MISS")
            tgt = f"{target:>7.1f}" if target is not None else f"{'-':>7}"
            ref = AUTHORS_CODE[key].get(b)
            ref_s = f"{ref:>8.1f}" if ref is not None else f"{'-':>8}"
            lines.append(f"{key:<27} {b:>5} {r['ratios'][key]:>7.2f} {tgt} {ref_s}{mark}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per batch")
    ap.add_argument("--allocator", choices=("jemalloc", "glibc"), default=None,
                    help="workers' allocator (default: jemalloc when installed)")
    ap.add_argument("--worker", choices=("idle", *CONFIGS), help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.batch)
        return
    if args.allocator is not None:
        global CHILD_ENV
        CHILD_ENV = JEMALLOC_ENV if args.allocator == "jemalloc" else {}
    batches = [int(b) for b in args.batches.split(",")]
    started, load_before = time.time(), os.getloadavg()
    idle = Worker("idle", max(batches))
    idle.read()
    idle_kib = idle.close()
    rows = []
    for b in batches:
        rows.append(measure_batch(b, args.quick, args.repeats, idle_kib))
        print(table(rows[-1:]), flush=True)
    payload = {
        "benchmark": "train_step",
        "machine": machine_info(),
        "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "wall_s": time.time() - started,
        "quick": args.quick,
        "settings": {
            "model": "TransformerConfig.mnli() (six encoders, d 768, ff 3072, 12 heads)",
            "seq_len": SEQ, "seed": SEED, "dtype": "float32", "dropout": "on (train mode)",
            "comera": {"build": "tensorized=True, max_rank=30, shapes='mnli'",
                       "optimizer": {"AdamW": COMERA_LR, "weight_decay": 0.0, **COMERA_ADAMW},
                       "loss": f"CE + {PENALTY_WEIGHT} * GateIndex(cost_weighted).penalty()"},
            "dense": {"optimizer": {"AdamW": DENSE_LR, "settings": "torch defaults"}},
            "galore": {"optimizer": {"GaLoreAdamW": DENSE_LR, **GALORE},
                       "time": "(199 regular + 1 refresh) / 200"},
            "child_env": CHILD_ENV,
            "memory": "VmHWM of the worker of each configuration minus an idle worker (same "
                      "imports, inputs, warm-up)",
        },  # fmt: skip
        "idle_vmhwm_kib": idle_kib,
        "targets": {k: {str(b): v for b, v in t.items()} for k, t in TARGETS.items()},
        "authors_code": {k: {str(b): v for b, v in t.items()} for k, t in AUTHORS_CODE.items()},
        "results": rows,
    }
    path = write_json("train_step", payload)
    print(table(rows))
    print(f"wrote {path} ({payload['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
