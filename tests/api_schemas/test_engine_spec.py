"""The spec translation both ways (:mod:`api_schemas.engine_spec`): every engine field that
``to_engine`` writes comes back to the wire field it was read from.

The fields come from the translation itself (every leaf of ``to_engine``'s output for specs
that exercise each branch) and from the engine's configs (``JobConfig.to_dict()`` lists every
field with its default; ``HFBertConfig`` the ``hf_bert`` model fields), never from a list kept
here: a new rename in ``to_engine`` without its entry in ``RENAMES`` fails
``test_every_field_the_translation_writes_comes_back_to_its_wire_field``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from api_schemas import JobCreate
from api_schemas.engine_spec import (
    RENAMES,
    engine_pointer,
    json_pointer,
    rename_of,
    to_engine,
    wire_path,
)
from api_schemas.jobs import HF_RESERVED
from engine.models.hf_bert.config import HFBertConfig
from engine.train.job import JobConfig
from tests.helpers.specs import (
    api_job,
    early_stage,
    finetune_stage,
    hf_dir,
    late_stage,
    mlp_model,
    model_spec,
    package,
    path_dataset,
    synthetic_dataset,
    upload_dataset,
)

TRAIN, VALID, MODEL = "/srv/data/TRAIN.file", "/srv/data/VALID.file", "/srv/models/MODEL"
# what to_engine writes from its arguments (the worker's resolution), not from a wire value
RESOLVED = {
    "data.train": "train_path",
    "data.valid": "valid_path",
    "model.config.path": "model_path",
    "model.config.tokenizer": "model_path",  # an hf_config source: its resolved tokenizer
    "training.device": "device",
}
CONSTANTS = {"version"}  # written by the translation itself (the engine config's version)
# engine values computed from their wire field: explicit modes leave shapes 'auto'
DERIVED = {"compression.shapes": lambda modes: modes if isinstance(modes, str) else "auto"}

STAGES = [
    early_stage(steps=7, gamma=0.02, lr={"cores": 0.002, "gates": 0.03}),
    late_stage(steps=9, lr_schedule="cosine", warmup_steps=2, loss_weight=0.3),
    late_stage(name="cut", steps=5, target_ratio=0.25, loss_ref=0.7),
    finetune_stage(epochs=2, eval_every=11),
]
SPECS: dict[str, dict[str, Any]] = {
    "path, explicit modes": api_job(
        name="by-path",
        model=mlp_model(48, 24, dropout=0.1),
        dataset=path_dataset(
            "train.npz",
            "npz",
            valid_path="valid.npz",
            n_train=123,
            n_valid=45,
            synthetic_seed=6,
            vocab_size=700,
            max_len=60,
            num_rows=999,
            text_a="a",
            text_b=None,
            label_field="y",
        ),
        compression={
            "max_rank": 7,
            "embedding_max_rank": 5,
            "d": 3,
            "min_size": 77,
            "layers": ["hidden.*"],
            "modes": {"hidden.0": {"in": [4, 4, 4], "out": [4, 3, 4]}},
            "gate_threshold": 0.03,
            "penalty": "uniform",
            "shrink_every": 13,
            "target_ratio": 0.4,
            "max_metric_drop": 2.5,
            "min_rank_fraction": 0.3,
        },
        schedule=STAGES,
        training={
            "batch_size": 24,
            "seed": 8,
            "grad_clip": 1.5,
            "weight_decay": 0.01,
            "log_every": 3,
            "eval_batches": 4,
            "fast_path": False,
            "cuda_graph": "off",
            "devices": 2,
            "nodes": 3,
        },
        checkpointing={"every_n_steps": 17, "keep": 3},
    ),
    "upload, paper shapes": api_job(
        name="by-upload",
        model=model_spec("transformer", {"d_model": 32, "n_heads": 2}),
        dataset=upload_dataset("ds_01ABC", "jsonl", valid_every=4, length_buckets=3),
        compression={"modes": "paper", "target_ratio": 0.3},
        schedule=STAGES,
        training={"precision": "bf16"},
    ),
    "synthetic, galore": api_job(
        name="generated",
        model=mlp_model(32),
        dataset=synthetic_dataset("mlp", params={"num_classes": 5}),
        compression={"method": "galore"},
        schedule=[early_stage(steps=3, gamma="auto")],
    ),
    "hf_bert, model directory": api_job(
        name="bert-dir",
        model=model_spec(
            "hf_bert",
            {"rank_allocation": "energy", "dropout": 0.05},
            source=hf_dir("models/tiny"),
            distill={"kind": "mse_hidden", "weight": 0.5},
        ),
        dataset=path_dataset("t.txt", "text", valid_every=2),
        schedule=[early_stage(steps=3)],
    ),
    "hf_bert, package": api_job(
        name="bert-pkg",
        model=model_spec("hf_bert", source=package(), distill={"kind": "none", "weight": 2.0}),
        dataset=synthetic_dataset("stdlib_text"),
        schedule=[early_stage(steps=3)],
    ),
    "hf, model directory": api_job(
        name="llama-dir",
        model=model_spec(
            "hf",
            {
                "task": "causal_lm",
                "targets": ["q_proj", "down_proj"],
                "tensorize_lm_head": True,
                "export_dense": True,
            },
            source=hf_dir("models/llama"),
            distill={"weight": 0.5, "temperature": 3.0},
        ),
        dataset=path_dataset("t.txt", "text", valid_every=2),
        schedule=[early_stage(steps=3)],
    ),
    "hf, uploaded": api_job(
        name="llama-uploaded",
        model=model_spec(
            "hf", {"task": "masked_lm"}, source={"kind": "uploaded", "id": "mdl_01ABC"}
        ),
        dataset=synthetic_dataset("stdlib_text"),
        schedule=[early_stage(steps=3)],
    ),
    "hf, package": api_job(
        name="hf-pkg",
        model=model_spec("hf", {"task": "sentence_embedding"}, source=package()),
        dataset=synthetic_dataset("stdlib_text"),
        schedule=[early_stage(steps=3)],
    ),
    "hf, from a config": api_job(
        name="gpt2-config",
        model=model_spec(
            "hf",
            {"task": "sequence_classification", "num_labels": 3},
            source={
                "kind": "hf_config",
                "config": {"model_type": "gpt2", "n_layer": 2, "n_embd": 32},
                "tokenizer": "tok.json",
            },
            distill={"weight": 0.0},
        ),
        dataset=synthetic_dataset("nli"),
        schedule=[early_stage(steps=3)],
    ),
}


def _spec(name: str) -> JobCreate:
    return JobCreate.model_validate(SPECS[name])


def _args(spec: JobCreate) -> dict[str, Any]:
    """What the worker would resolve: the files, the model directory, the device."""
    valid = VALID if spec.dataset.valid_path is not None else None
    return {"train_path": TRAIN, "valid_path": valid, "device": "cpu", "model_path": MODEL}


def _engine(spec: JobCreate) -> dict[str, Any]:
    return to_engine(spec, **_args(spec))


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    """``{engine field path: value}`` of every leaf: mappings of field names are walked (not
    those keyed by layer patterns), lists of mappings (the schedule) by index; other lists are
    values."""
    if isinstance(value, dict) and value and all(str(k).isidentifier() for k in value):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(leaves(item, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for i, item in enumerate(value):
            out.update(leaves(item, f"{path}[{i}]"))
        return out
    return {path: value}


def at(body: Any, parts: list[str | int]) -> Any:
    for part in parts:
        body = body[part]
    return body


def _wire_value(spec: JobCreate, parts: list[str | int]) -> Any:
    """The submitted value at ``parts``; absent (a default the dump omits): None."""
    try:
        return at(spec.model_dump(mode="json", by_alias=True), parts)
    except (KeyError, IndexError, TypeError):
        return None


@pytest.mark.parametrize("name", SPECS)
def test_every_field_the_translation_writes_comes_back_to_its_wire_field(name: str):
    """Backward then forward is the identity: for every leaf ``to_engine`` writes, the wire
    field ``engine_pointer`` names holds the value the engine got (or, for the files and the
    model directory the worker resolves, the reference to them)."""
    spec = _spec(name)
    written = leaves(_engine(spec))
    assert len(written) >= 20
    for field, value in written.items():
        if field in CONSTANTS:
            continue
        parts = wire_path(field, spec)
        assert parts is not None, (
            f"to_engine writes {field!r}, which the wire does not have: a rename without its "
            "entry in api_schemas.engine_spec.RENAMES"
        )
        if field in RESOLVED:
            assert value == _args(spec)[RESOLVED[field]], field
            continue
        wire = _wire_value(spec, parts)
        assert DERIVED.get(field, lambda v: v)(wire) == value, f"{field} <- {parts}"


def _entry(spec: JobCreate, field: str) -> str | None:
    rename = rename_of(field, spec)
    return None if rename is None else f"{rename.engine} ({rename.when or 'always'})"


def test_every_rename_is_exercised_by_the_translation():
    """Each entry of the map names a field ``to_engine`` really writes for some spec (so the
    round trip above covers it), except the one the engine reads from the model directory."""
    read_from_files = {  # HFBertConfig: from config.json; HFConfig: from the data and tokenizer
        "model.config.architecture",
        "model.config.max_len",
        "model.config.pad_token_id",
        "model.config.mask_token_id",
        "model.config.tokenizer_vocab_size",
    }
    fired: set[str] = set()
    for name in SPECS:
        spec = _spec(name)
        for field in leaves(_engine(spec)):
            if (entry := _entry(spec, field)) is not None:
                fired.add(entry)
    entries = {f"{r.engine} ({r.when or 'always'})" for r in RENAMES}
    unexercised = {e for e in entries - fired if e.split(" ")[0] not in read_from_files}
    assert not unexercised, f"no spec here makes to_engine write {sorted(unexercised)}"
    assert len(entries) == len(RENAMES) == 28


def test_hf_bert_fields_the_wire_reserves_are_renamed():
    """``model.config`` keys the wire refuses for ``hf_bert`` (``HF_RESERVED``: set from
    ``model.source`` / ``model.distill``) never point back into ``model.config``; every other
    field of the engine's ``HFBertConfig`` does, under its own name."""
    spec = _spec("hf_bert, model directory")
    engine_fields = {f.name for f in dataclasses.fields(HFBertConfig)}
    assert set(HF_RESERVED) <= engine_fields
    for name in engine_fields:
        pointer = engine_pointer(f"model.config.{name}", spec)
        if name in HF_RESERVED:
            assert not pointer.startswith("/model/config"), name
        else:
            assert pointer == f"/model/config/{name}", name
    package = _spec("hf_bert, package")
    assert engine_pointer("model.config.path", package) == "/model/source/name"
    assert engine_pointer("model.config.path", spec) == "/model/source/path"
    assert engine_pointer("model.config.architecture.hidden_size", spec) == "/model/source"


@pytest.mark.parametrize("name", [n for n in SPECS if not n.startswith("hf")])
def test_engine_only_fields_point_at_their_nearest_wire_ancestor(name: str):
    """Every field of the engine config (``JobConfig.to_dict()``: defaults filled) has a
    pointer: its own wire field, or for a field only the engine has, the nearest ancestor the
    wire has (``""``, the whole body, for ``version`` and the ``galore`` section)."""
    spec = _spec(name)
    full = leaves(JobConfig.from_dict(_engine(spec)).to_dict())
    written = leaves(_engine(spec))
    engine_only = {f for f in full if wire_path(f, spec) is None}
    assert engine_only, "the engine has fields the wire does not"
    assert not engine_only & (set(written) - CONSTANTS)
    for field in engine_only:
        ancestor, parts = field, None
        while parts is None and ancestor:
            ancestor = ancestor[: max(ancestor.rfind("."), ancestor.rfind("["), 0)]
            parts = wire_path(ancestor, spec) if ancestor else None
        assert engine_pointer(field, spec) == json_pointer(parts or []), field
        if field.split(".")[0] in ("galore", "version"):
            assert engine_pointer(field, spec) == "", field


@pytest.mark.parametrize(
    ("field", "spec", "pointer"),
    [
        ("schedule[1].target_ratio", "path, explicit modes", "/compression/target_ratio"),
        ("schedule[2].target_ratio", "path, explicit modes", "/schedule/2/target_ratio"),
        ("schedule[0].lr.cores", "path, explicit modes", "/schedule/0/lr/cores"),
        ("data.train", "path, explicit modes", "/dataset/path"),
        ("data.train", "upload, paper shapes", "/dataset/dataset_id"),
        ("data.valid", "path, explicit modes", "/dataset/valid_path"),
        ("data.kind", "path, explicit modes", "/dataset/format"),
        ("data.kind", "synthetic, galore", "/dataset/source"),
        ("data.n_train", "synthetic, galore", "/dataset/n_train"),
        ("data.params.num_classes", "synthetic, galore", "/dataset/params/num_classes"),
        ("data.shuffle_buffer", "synthetic, galore", "/dataset"),
        ("checkpoint.every_steps", "synthetic, galore", "/checkpointing/every_n_steps"),
        ("compression.shapes", "upload, paper shapes", "/compression/modes"),
        ("compression.modes", "path, explicit modes", "/compression/modes"),
        ("compression.layers[0]", "path, explicit modes", "/compression/layers/0"),
        ("model.config.hidden", "synthetic, galore", "/model/config/hidden"),
        ("model.config.distill", "hf_bert, model directory", "/model/distill/kind"),
        ("model.config.distill_weight", "hf_bert, model directory", "/model/distill/weight"),
        ("method", "synthetic, galore", "/compression/method"),
        ("galore.rank", "synthetic, galore", ""),
        ("version", "synthetic, galore", ""),
        ("", "synthetic, galore", ""),
    ],
)
def test_known_pointers(field: str, spec: str, pointer: str):
    assert engine_pointer(field, _spec(spec)) == pointer
    assert engine_pointer(field, SPECS[spec]) == pointer  # the stored JSON works the same


def test_without_a_spec_the_unconditional_names_apply():
    assert engine_pointer("data.train") == "/dataset/path"
    assert engine_pointer("model.config.path") == "/model/config/path"
    assert engine_pointer(None) == ""
    assert engine_pointer("model.config.a/b~c") == "/model/config/a~1b~0c"  # RFC 6901
