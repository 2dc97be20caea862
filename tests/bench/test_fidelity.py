"""bench.fidelity / bench.fidelity_encoder: the jobs they run and the tables they print."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench import fidelity, fidelity_encoder
from engine.models.hf_bert import load_pretrained
from engine.models.hf_bert.config import check_model_dir, read_architecture
from engine.train import JobConfig
from tests.helpers.hf_bert import MINILM


def test_the_encoder_bench_runs_the_committed_recipe(monkeypatch):
    job = fidelity_encoder.recipe(8.0, steps=10)
    assert job["model"]["config"]["target_compression"] == 8.0
    assert job["schedule"][-1]["steps"] == 10
    assert JobConfig.from_dict(job).model.arch == "hf_bert"
    asked = []

    def pool(params):  # the recipe's packages take ~30 s to parse: a pool of 3,000 here
        asked.append(params)
        return tuple(f"Sentence number {i} of the pool." for i in range(3000))

    monkeypatch.setattr(fidelity_encoder, "stdlib_sentences", pool)
    split = fidelity_encoder.recipe(5.0, modules=["[a-l]*"])
    (params,) = asked
    assert params.modules == ("[a-l]*",)
    assert list(params.packages) == job["data"].get("params", {}).get("packages", [])
    assert split["data"]["params"]["modules"] == ["[a-l]*"]
    assert split["data"]["n_train"] + split["data"]["n_valid"] == 3000
    config = split["model"]["config"]
    assert config["calibration_sentences"] == min(
        3000 - 256, job["model"]["config"]["calibration_sentences"]
    )
    JobConfig.from_dict(split)
    sentences = ["Sentence number 7 of the pool.", "A sentence of another source."]
    assert fidelity_encoder.unseen(sentences, split) == ["A sentence of another source."]


@pytest.mark.slow
def test_the_plain_svd_baseline_spends_the_same_budget():
    directory = check_model_dir(MINILM)
    teacher = load_pretrained(directory, read_architecture(directory))
    sentences = ["Return the number of items.", "The statement is executed in a new frame."]
    batches = fidelity_encoder.encode(sentences, directory / "tokenizer.json", 32)
    sets = fidelity_encoder.Sets(teacher, {"few": batches})
    config = fidelity_encoder.recipe(5.0)["model"]["config"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads wait on each other on busy cores
    try:
        svd = fidelity_encoder.svd_baseline(config, 5.0, sets)
    finally:
        torch.set_num_threads(threads)
    assert svd["rank"] == 51  # 10,616,832 / 5 entries over 36 layers of r (in + out) each
    assert 5.0 <= svd["ratio_encoder_linears"] < 5.1
    assert 0.0 < svd["cosine"]["few"] < 0.6  # measured 0.25 on 1,478 sentences


def test_the_early_stage_runs_the_longer_of_its_steps_and_its_epochs():
    assert fidelity.early_steps(1437) == fidelity.EARLY_STEPS  # digits: 22.5 steps an epoch
    assert fidelity.early_steps(2856) == 1339  # stdlib_modules: 30 epochs of 44.6 steps
    spec = fidelity.job(Path("t.npz"), Path("v.npz"), "comera", 0, 1339)
    assert spec["schedule"][0]["steps"] == 1339
    assert fidelity.late_job(spec, 0.5)["schedule"][0]["steps"] == 1339


def encoder_payload() -> dict:
    cos = {"held_out": 0.9, "reference": 0.88, "train": 0.93}
    point = {
        "target_compression": 5.0,
        "data": {"params": {}, "n_train": 7750},
        "ratio_encoder_linears": 5.001,
        "cosine_after_fit": cos,
        "cosine": cos,
        "steps": 800,
        "seconds": 300.0,
        "svd": {"rank": 51, "ratio_encoder_linears": 5.02, "cosine": cos, "seconds": 20.0},
    }
    return {
        "points": [point],
        "family_split": None,
        "checks": {"unseen_source_at_least_0.9": False},
        "recipe": {"training": {"batch_size": 32}},
    }


def test_the_tables_print_from_a_payload(capsys):
    run = {"accuracy": 0.95, "accuracy_per_split": [0.95], "seconds": 1.0, "at_chance": False}
    late = {**run, "ratio": 12.0, "target_reached": [True], "reasons": [None]}
    payload = {
        "protocol": {"job": fidelity.job(Path("t.npz"), Path("v.npz"), "comera", 0, 720)},
        "datasets": {
            "wine": {
                "info": {"rows": 178, "features": 13, "n_classes": 3},
                "runs": {"dense": run, "early": {**run, "ratio": 12.0}, "late-0.5": late},
            }
        },
        "encoder": encoder_payload(),
    }
    fidelity.print_markdown(payload)
    fidelity_encoder.print_table(payload["encoder"])
    out = capsys.readouterr().out
    assert "| wine (178 x 13, 3) | MLP [256, 256], 64 | late-0.5 | 95.00% | 12.0x | 1/1 |" in out
    assert "0.900 held out, 0.880 Language Reference | 5.00x" in out
    assert "recipe 5x" in out
