"""The job configs of :mod:`bench.comera_ablation`: the NLI encoder classifier's and the
DLRM's data, model, compression and stages, and the seven jobs built from them (dense, early,
three late branches at :data:`TARGETS`; dense and CoMERA DLRM), full or ``quick``."""

from __future__ import annotations

import copy
from typing import Any

TARGETS = (0.8, 0.5, 0.2)
NLI_PARAMS = {
    "n_words": 32,
    "n_topics": 4,
    "min_premise": 4,
    "max_premise": 8,
    "min_hypothesis": 2,
    "max_hypothesis": 4,
}
NLI_DATA = {
    "kind": "synthetic",
    "generator": "nli",
    "n_train": 20_000,
    "n_valid": 2_000,
    "max_len": 32,
    "vocab_size": 1000,
    "synthetic_seed": 0,
    "params": NLI_PARAMS,
}
NLI_MODEL = {
    "arch": "transformer",
    "config": {"d_model": 64, "n_heads": 4, "d_ff": 128, "n_layers": 2, "max_len": 32},
}
NLI_COMPRESSION = {
    "max_rank": 8,
    "layers": ["embeddings.word", "encoder.*.ffn.*"],
    "penalty": "cost_weighted",
    "shrink_every": 50,
}
NLI_EPOCHS = 8
NLI_DENSE_LR = {"cores": 1e-3, "gates": 0.0, "others": 1e-3}
NLI_EARLY = {"gamma": 0.2, "lr": {"cores": 3e-3, "gates": 3e-3, "others": 1e-3}}
NLI_LATE = {"steps": 400, "loss_ref": 0.1, "lr": {"cores": 1e-3, "gates": 1e-2, "others": 1e-3}}
NLI_FINETUNE = {"steps": 150, "lr": {"cores": 1e-3, "gates": 0.0, "others": 1e-3}}
DLRM_DATA = {
    "kind": "synthetic",
    "generator": "criteo",
    "n_train": 100_000,
    "n_valid": 50_000,
    "num_rows": 10_000,
    "synthetic_seed": 0,
}
DLRM_MODEL = {
    "arch": "dlrm",
    "config": {"embedding_dim": 16, "bottom_widths": [64, 16], "top_widths": [64, 32]},
}
DLRM_COMPRESSION = {
    "max_rank": 8,
    "layers": ["embeddings.*"],
    "penalty": "cost_weighted",
    "shrink_every": 50,
}
DLRM_EPOCHS = 6
DLRM_DENSE_LR = {"cores": 1e-3, "gates": 0.0, "others": 1e-3}
DLRM_EARLY = {"gamma": 0.02, "lr": {"cores": 3e-3, "gates": 1e-2, "others": 1e-3}}


# -- job configs ------------------------------------------------------------------------------
def _job(
    name: str,
    method: str,
    model: dict,
    data: dict,
    compression: dict,
    schedule: list,
    batch_size: int,
) -> dict[str, Any]:
    return {
        "name": name,
        "method": method,
        "model": copy.deepcopy(model),
        "data": copy.deepcopy(data),
        "compression": copy.deepcopy(compression),
        "schedule": schedule,
        "training": {"batch_size": batch_size, "seed": 0, "log_every": 10},
    }


def nli_jobs(tokenizer: str, quick: bool) -> dict[str, dict[str, Any]]:
    data = {**NLI_DATA, "tokenizer": tokenizer}
    length = {"epochs": NLI_EPOCHS}
    late, finetune = dict(NLI_LATE), dict(NLI_FINETUNE)
    if quick:
        data.update(n_train=2_000, n_valid=500)
        length = {"steps": 60}
        late["steps"], finetune["steps"] = 30, 10
    early = {"kind": "early", **length, **NLI_EARLY}
    jobs = {
        "nli-dense": _job(
            "nli-dense",
            "dense",
            NLI_MODEL,
            data,
            NLI_COMPRESSION,
            [{"kind": "early", **length, "lr": NLI_DENSE_LR}],
            64,
        ),
        "nli-early": _job("nli-early", "comera", NLI_MODEL, data, NLI_COMPRESSION, [early], 64),
    }
    for ratio in TARGETS:
        name = f"nli-late-{ratio}"
        stages = [
            early,
            {"kind": "late", "target_ratio": ratio, "name": f"late-{ratio}", **late},
            {"kind": "finetune", **finetune},
        ]
        jobs[name] = _job(name, "comera", NLI_MODEL, data, NLI_COMPRESSION, stages, 64)
    return jobs


def dlrm_jobs(quick: bool) -> dict[str, dict[str, Any]]:
    data, length = dict(DLRM_DATA), {"epochs": DLRM_EPOCHS}
    if quick:
        data.update(n_train=5_000, n_valid=2_000)
        length = {"epochs": 1}
    return {
        "dlrm-dense": _job(
            "dlrm-dense",
            "dense",
            DLRM_MODEL,
            data,
            DLRM_COMPRESSION,
            [{"kind": "early", **length, "lr": DLRM_DENSE_LR}],
            256,
        ),
        "dlrm-comera": _job(
            "dlrm-comera",
            "comera",
            DLRM_MODEL,
            data,
            DLRM_COMPRESSION,
            [{"kind": "early", **length, **DLRM_EARLY}],
            256,
        ),
    }
