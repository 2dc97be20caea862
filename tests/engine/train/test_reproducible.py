"""A masked-LM job is a function of its config: two processes, and a resumed third, agree bitwise.

Each run is its own ``python -m engine.train`` process with another ``PYTHONHASHSEED`` (and
the random per-process hash seeds of the Rust ``tokenizers`` library), and trains its own
WordPiece tokenizer. With the library's trainer the ``##`` pieces took their ids in a
hash-map order, so the runs' batches differed (the same loss at step 1, another from step 2 on,
in ``examples/engine/mlm_bert.json``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.services import train_cli
from tests.helpers.specs import engine_job, mlm_model, stages, synthetic_data

JOB = engine_job(
    name="tiny-mlm",
    method="comera",
    model=mlm_model(),
    data=synthetic_data("mlm", n_train=160, n_valid=16, max_len=24, vocab_size=150),
    compression={"max_rank": 4, "shrink_every": 2, "layers": ["encoder.*", "embeddings.word"]},
    schedule=stages(
        early={"steps": 4, "gamma": 0.01, "lr": {"cores": 0.005, "gates": 0.003}},
        late={"steps": 3, "target_ratio": 0.7},
    ),
    training={"batch_size": 16, "seed": 0, "log_every": 1},
    checkpoint={"every_steps": 3, "keep": 10},
)


def _train(tmp_path: Path, out: Path, hash_seed: int, *args: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed), "OMP_NUM_THREADS": "1"}
    proc = train_cli(tmp_path, JOB, out, *args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _losses(out: Path) -> dict[int, float]:
    """Training loss by step (a resumed run appends: its entries win)."""
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {e["step"]: e["train_loss"] for e in events if e["event"] == "step"}


def _assert_same_model(a: Path, b: Path) -> None:
    x, y = (
        load_file(a / "model" / "model.safetensors"),
        load_file(b / "model" / "model.safetensors"),
    )
    assert x.keys() == y.keys()
    for k in x:
        assert torch.equal(x[k], y[k]), f"{k} differs"


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("mlm")
    _train(tmp, tmp / "a", hash_seed=1)
    return tmp / "a"


def test_two_processes_train_the_same_tokenizer_losses_and_model(first, tmp_path):
    _train(tmp_path, tmp_path / "b", hash_seed=2)
    tokenizer = (first / "tokenizer.json").read_bytes()
    assert tokenizer == (tmp_path / "b" / "tokenizer.json").read_bytes()
    losses = _losses(first)
    assert sorted(losses) == list(range(1, 8))
    assert losses == _losses(tmp_path / "b")  # floats from JSON: bitwise equal
    _assert_same_model(first, tmp_path / "b")


def test_resume_auto_in_a_fresh_process_matches_the_uninterrupted_run(first, tmp_path):
    out = tmp_path / "c"
    (out / "checkpoints").mkdir(parents=True)
    ckpt = first / "checkpoints" / "step-00000003.safetensors"  # mid-epoch, in the early stage
    assert ckpt.exists(), sorted(p.name for p in (first / "checkpoints").iterdir())
    shutil.copy(ckpt, out / "checkpoints" / ckpt.name)
    # no tokenizer.json: the resumed process trains it again, to the same ids
    _train(tmp_path, out, 3, "--resume", "auto")
    full, resumed = _losses(first), _losses(out)
    assert sorted(resumed) == list(range(4, 8))
    assert resumed == {s: full[s] for s in resumed}
    _assert_same_model(first, out)
