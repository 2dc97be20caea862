"""bench.fidelity / bench.fidelity_encoder: the jobs they run and the tables they print."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import fidelity, fidelity_data, fidelity_encoder, fidelity_results, fidelity_summary
from engine.models.hf_bert import load_pretrained
from engine.models.hf_bert.config import check_model_dir, read_architecture
from engine.train import JobConfig
from engine.train.guard import FidelityGuard
from engine.tt.shapes import resolve_modes
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


def test_the_late_branches_set_the_teacher_by_variant_and_the_plan_runs_the_ablation():
    base = fidelity.job(Path("t.npz"), Path("v.npz"), "comera", 0, 720)
    assert base["compression"]["layers"] == ["*"]  # every tensorizable layer of the MLP
    assert fidelity.job(Path("t"), Path("v"), "comera", 0, 720, "hidden.1")["compression"][
        "layers"
    ] == ["hidden.1"]
    for variant, (teacher, _) in fidelity.VARIANTS.items():
        late, finetune = fidelity.late_job(base, 0.2, variant)["schedule"][1:]
        weight = fidelity.TEACHER_WEIGHT if teacher else 0.0
        assert late["target_ratio"] == 0.2
        early_lr = base["schedule"][0]["lr"]  # the late stage at a fraction of the early rates
        assert late["lr"] == {k: v * fidelity.LATE_LR_SCALE for k, v in early_lr.items()}
        assert late["teacher_weight"] == finetune["teacher_weight"] == weight
        JobConfig.from_dict(fidelity.late_job(base, 0.2, variant))
    main = fidelity.plan(fidelity.MAIN)
    assert {(t, v) for t in (0.5, 0.2) for v in fidelity.VARIANTS} <= set(main)
    assert fidelity.plan("hidden.1") == [(0.8, "full"), (0.5, "full"), (0.2, "full")]
    text = fidelity.text_job(Path("t.jsonl"), Path("v.jsonl"), "comera", 0, 100)
    assert text["model"]["arch"] == "transformer" and text["data"]["kind"] == "jsonl"
    # the automatic start, as the MLP rows: no max_rank, d or gamma, the same early target
    assert not {"max_rank", "d"} & set(text["compression"]) and "gamma" not in text["schedule"][0]
    assert text["schedule"][0]["target_ratio"] == fidelity.TEXT_EARLY_TARGET
    assert JobConfig.from_dict(text).compression.options.max_rank == "auto"
    JobConfig.from_dict(fidelity.late_job(text, 0.5, "neither"))


def test_the_guard_without_back_off_stops_where_the_engine_retries():
    def failed_cut(guard):
        guard.reference = 0.9
        guard.accepted = {"step": 0, "size": 100, "metric": 0.9}
        guard.cut_made(10, 10, 100, 40)
        return guard.back_off(35, 40, {"accuracy": 0.5}, one_rank=5, final=False)

    assert failed_cut(FidelityGuard("accuracy", 1.0, interval=25))["decision"] == "back_off"
    with fidelity.guard_stops():
        guard = FidelityGuard("accuracy", 1.0, interval=25)
        entry = failed_cut(guard)
        assert entry["decision"] == "stop" and entry["next_cut"] is None
        assert entry["next_lr_scale"] is None and guard.lr_scale == 1.0  # no rates lowered
    assert failed_cut(FidelityGuard("accuracy", 1.0, interval=25))["decision"] == "back_off"


def _fast_protocol(monkeypatch):
    monkeypatch.setattr(fidelity, "EARLY_STEPS", 30)
    monkeypatch.setattr(fidelity, "EARLY_EPOCHS", 1)
    monkeypatch.setattr(fidelity, "TEXT_EARLY_EPOCHS", 1)
    monkeypatch.setattr(fidelity, "LATE_MAX_STEPS", 40)
    monkeypatch.setattr(fidelity, "FINETUNE_STEPS", 10)
    monkeypatch.setattr(fidelity, "TEXT_MODEL", {**fidelity.TEXT_MODEL, "d_model": 32, "d_ff": 64})
    monkeypatch.setattr(fidelity, "TEXT_DATA", {"vocab_size": 200, "max_len": 16})
    # the teacher's pair of the ablation, both guards stopping (guard_stops)
    monkeypatch.setattr(
        fidelity, "plan", lambda layers, text=False: [(0.5, "no-back-off"), (0.5, "neither")]
    )


def test_a_fold_runs_every_path_and_the_checks_and_tables_follow(monkeypatch, tmp_path, capsys):
    """Both workloads, a fold each, with a short protocol (< 20 s): the MLP on wine with every
    layer selected (``hidden.0``, 13 x 256, stays dense: two cores of it break even at rank
    12.4), the transformer on 200 sentences of 10 classes."""
    _fast_protocol(monkeypatch)
    torch.set_num_threads(1)
    x, y, info = fidelity_data.load("wine")
    rows = fidelity.run_split("wine", 0, tmp_path, x, y, ("all",))
    assert {"dense", "all/early", "all/late-0.5/no-back-off", "all/late-0.5/neither"} <= set(rows)
    # the room probe: the early stage trained directly to a quarter of its own target
    probe, early = rows["all/room"], rows["all/early"]
    assert probe["early_target_reached"] and probe["size"] < early["size"] / 2
    late = rows["all/late-0.5/neither"]
    # the late stage starts from the early model rewritten in 2 + 2 cores (the engine's default
    # for its own two cores): the same ranks plus the two outer cores, 16^2 + 16^2 entries
    (n1, _), (_, m2) = (resolve_modes(256, None, d=2, descending=d).modes for d in (True, False))
    assert late["size_start"] == rows["all/early"]["size"] + n1 * n1 + m2 * m2
    assert set(late["ranks"]) == {"hidden.1"} and len(late["ranks"]["hidden.1"]) == 5
    assert late["rank_one_room"] > 1 and late["late_ratio"] >= 1
    assert all(r["decision"] != "back_off" for r in late["retries"])  # it stops instead
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "theta", "kappa", "zeta"]
    sentences = [
        f"{words[i % 9]} {words[(i * 7) % 9]} item {i % 10} of the pool" for i in range(200)
    ]
    labels = np.arange(200) % 10
    text = fidelity.run_split("stdlib_modules_text", 0, tmp_path, sentences, labels)
    assert {"dense", "encoder/early", "encoder/late-0.5/neither"} <= set(text)
    assert any(k.startswith("encoder.") for k in text["encoder/early"]["ranks"])
    results = {}
    for name, fold, sets in (
        ("wine", rows, ("all",)),
        ("stdlib_modules_text", text, ("encoder",)),
    ):
        agg = fidelity_summary.aggregate([fold])
        checks = {s: fidelity_summary.checks(name, agg, [fold], s) for s in sets}
        assert checks[sets[0]]["no_run_ends_below_tolerance"] in (True, False)
        info = {"rows": 178 if name == "wine" else 200, "features": 13, "n_classes": 3}
        results[name] = {"info": info, "runs": agg, "checks": checks}
    abl = {"mlp": fidelity_summary.ablation({"wine": results["wine"]})}
    assert set(abl["mlp"]["parts"]) == {"teacher"}  # no-back-off against neither only
    summary = fidelity_summary.summary_checks(results, abl)
    assert "wine:no_run_ends_below_tolerance" in summary
    assert "stdlib_modules_text:early_target_reached" in summary
    assert "ablation:mlp:teacher_adds" in summary
    fidelity_summary.print_markdown({"datasets": results, "encoder": None})
    out = capsys.readouterr().out
    assert "| wine | all | 0.5 |" in out and "| stdlib_modules_text | encoder | 0.5 |" in out


def test_room_is_shown_by_the_probe_or_by_the_late_stage_reaching_its_target():
    def fold(start: float, probe: float | None, reached: bool, late: float) -> dict:
        row = {"target_reached": reached, "stage_start_accuracy": start}
        row.update(late_accuracy=late, accuracy=late)
        out = {"all/late-0.2/full": row}
        if probe is not None:
            out["all/room"] = {"accuracy": probe}
        return out

    splits = [
        fold(0.90, 0.895, False, 0.90),  # the probe holds within a point: room
        fold(0.90, 0.885, False, 0.90),  # the probe falls 1.5 points, the target missed: none
        fold(0.90, 0.50, True, 0.895),  # reached within the tolerance: room, whatever the probe
        fold(0.90, 0.50, True, 0.80),  # "reached" 10 points under its start: none
        fold(0.90, None, False, 0.90),  # no probe (the text row), not reached: none
    ]
    assert fidelity_summary.room_shown(splits) == [True, False, True, False, False]
    # the 0.2 check counts the roomy folds only
    reached = [False, False, True, False, False]
    runs = {"all/late-0.2/full": {"reached_within_tolerance": reached}}
    assert _checks_02(splits, runs) is False  # 1 hit of 2 folds: ceil(3 * 2 / 5) = 2 asked
    splits[0]["all/room"]["accuracy"] = 0.50  # only the reached fold is roomy: 1 of 1
    assert _checks_02(splits, runs) is True
    for s in splits:
        s["all/late-0.2/full"]["target_reached"] = False
    assert (
        _checks_02(splits, {"all/late-0.2/full": {"reached_within_tolerance": [False] * 5}}) is None
    )


def _checks_02(splits: list, runs: dict) -> bool | None:
    early = {"early_target_reached": True, "early_size_start": 2, "early_size_end": 1}
    splits = [{**s, "all/early": early} for s in splits]
    agg = {"dense": {"accuracy": 0.9}, "all/early": {"accuracy": 0.9}, **runs}
    for v in agg.values():
        v.setdefault("within_tolerance", [True])
    out = fidelity_summary.checks("x", agg, splits)
    return out["late-0.2_reached_within_tolerance_3_of_5"]


def test_the_text_folds_are_the_folds_of_the_embedded_set(tmp_path):
    y = np.arange(50) % 5
    sentences = [f"sentence {i}" for i in range(50)]
    train, valid, info = fidelity_data.split_text("t", sentences, y, 2, tmp_path)
    rows = [json.loads(line) for line in valid.read_text().splitlines()]
    _, va = fidelity_data.fold_indices(y, 2)
    assert [r["text"] for r in rows] == [sentences[i] for i in va]
    assert info == {"train": 40, "valid": 10, "features": "text"}


def test_the_tables_print_from_a_payload(capsys):
    run = {"accuracy": 0.95, "accuracy_per_split": [0.95], "seconds": 1.0, "at_chance": False}
    late = {
        **run,
        "ratio": 12.0,
        "late_ratio": 2.5,
        "target_reached": [True],
        "reached_within_tolerance": [True],
        "reasons": [None],
    }
    payload = {
        "datasets": {
            "wine": {
                "info": {"rows": 178, "features": 13, "n_classes": 3},
                "runs": {
                    "dense": run,
                    "all/early": {**run, "ratio": 12.0},
                    "all/late-0.5/full": late,
                    "all/late-0.5/neither": {**late, "reached_within_tolerance": [False]},
                },
            }
        },
        "encoder": encoder_payload(),
    }
    fidelity_summary.print_markdown(payload)
    fidelity_encoder.print_table(payload["encoder"])
    out = capsys.readouterr().out
    assert "| wine (178) | all | 95.00% | 95.00% at 12.0x | - |" in out
    assert "| wine | all | 0.5 | 95.00%, 2.50x, 1/1 | - | - | 95.00%, 2.50x, 0/1 |" in out
    assert "0.900 held out, 0.880 Language Reference | 5.00x" in out
    assert "recipe 5x" in out


def test_skip_encoder_keeps_the_last_minilm_pass(tmp_path):
    out = tmp_path / "fidelity.json"
    assert fidelity_results.previous_results(str(out)) == {}
    out.write_text(json.dumps({"encoder": {"points": []}}))
    assert fidelity_results.previous_results(str(out))["encoder"] == {"points": []}


def test_update_keeps_the_other_data_sets_and_lists_the_run():
    previous = {
        "protocol": {"reps": 5, "text_reps": 2, "text_job": {"old": 1}},
        "machine": {"cpus": 2},
        "note": None,
        "seconds": 100.0,
    }
    payload = {
        "protocol": {
            "text_job": {"new": 1},
            "text_plan": ["late-0.5/full"],
            "text_early_epochs_at_least": 60,
            "early_steps": 9,
        },
        "machine": {"cpus": 4},
        "seconds": 50.0,
    }
    args = argparse.Namespace(text_reps=5, reps=5, note=None)
    fidelity_results.merge_update(payload, previous, ["stdlib_modules_text"], args)
    assert payload["protocol"] == {
        "reps": 5,
        "text_reps": 5,
        "text_job": {"new": 1},
        "text_plan": ["late-0.5/full"],
        "text_early_epochs_at_least": 60,
    }
    assert payload["seconds"] == 150.0 and payload["machine"] == {"cpus": 2}
    assert payload["updates"][0]["datasets"] == ["stdlib_modules_text"]


def test_the_four_core_automatic_start_keeps_the_calibrated_ranks():
    """``--start auto-d2``: no max_rank or gamma given, so the engine still calibrates the
    ranks (max_rank "auto") and starts from the twin, in TT linears of 2 + 2 cores."""
    spec = fidelity.job(Path("t.npz"), Path("v.npz"), "comera", 0, 720, start="auto-d2")
    assert spec["compression"]["d"] == 2 and "max_rank" not in spec["compression"]
    assert "gamma" not in spec["schedule"][0]
    options = JobConfig.from_dict(spec).compression.options
    assert options.max_rank == "auto" and options.linear_order == 2
