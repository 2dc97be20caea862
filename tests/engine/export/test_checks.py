"""The loader refuses what it cannot trust: tampered weights, unknown formats, mismatches."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.export import (
    CheckpointError,
    export_compressed,
    load_compressed,
    read_manifest,
)
from engine.export.manifest import json_safe, validate_manifest


@pytest.fixture(scope="module")
def ckpt(trained, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    export_compressed(trained.model, path, **trained.export_kwargs())
    return path


@pytest.fixture
def copy_ckpt(ckpt, tmp_path):
    for f in ckpt.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    return tmp_path


def _edit_manifest(path, fn) -> None:
    man = json.loads((path / "manifest.json").read_text())
    fn(man)
    (path / "manifest.json").write_text(json.dumps(man))


def _rewrite_weights(path, fn) -> None:
    """Change the tensors and re-sign them, so only the key / shape checks can object."""
    tensors = fn(load_file(path / "model.safetensors"))
    save_file(tensors, path / "model.safetensors")
    blob = (path / "model.safetensors").read_bytes()

    def sign(man):
        man["weights"].update(bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())

    _edit_manifest(path, sign)


def test_untouched_copy_loads(copy_ckpt):
    model, manifest = load_compressed(copy_ckpt / "manifest.json")  # the file path works too
    assert manifest["arch"] == "transformer" and not model.training


@pytest.mark.parametrize("where", ["payload", "header"])
def test_flipped_byte_is_refused(copy_ckpt, where):
    path = copy_ckpt / "model.safetensors"
    blob = bytearray(path.read_bytes())
    i = len(blob) - 3 if where == "payload" else 20
    blob[i] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="sha256 .* does not match"):
        load_compressed(copy_ckpt)


def test_truncated_file_is_refused(copy_ckpt):
    path = copy_ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="size .* does not match"):
        load_compressed(copy_ckpt)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(format_version=2), "format_version 2 is not supported"),
        (lambda m: m.update(format="other"), "format must be 'comera-compressed'"),
        (lambda m: m.update(arch="nope"), "arch 'nope' is not known"),
        (lambda m: m.pop("layers"), r"missing keys \['layers'\]"),
        (lambda m: m.update(dtype="int8"), "dtype must be one of"),
        (lambda m: m.update(tensorized="yes"), "tensorized must be true or false"),
        (lambda m: m["layers"][0].update(ranks=[1, 2]), r"layers\[0\].ranks must have 3"),
        (lambda m: m["model_config"].update(d_model=7), "invalid model_config"),
    ],
)
def test_bad_manifest_is_refused_with_a_clear_message(copy_ckpt, edit, message):
    _edit_manifest(copy_ckpt, edit)
    with pytest.raises(CheckpointError, match=message):
        load_compressed(copy_ckpt)


def test_not_json_is_refused(copy_ckpt):
    (copy_ckpt / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_manifest(copy_ckpt)
    with pytest.raises(CheckpointError, match="must hold a JSON object"):
        validate_manifest([1, 2])


def test_missing_files(tmp_path, copy_ckpt):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        load_compressed(tmp_path / "nowhere")
    (copy_ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_compressed(copy_ckpt)


def test_unexpected_and_missing_keys_are_refused(copy_ckpt):
    _rewrite_weights(copy_ckpt, lambda t: {**t, "extra.weight": torch.zeros(2)})
    with pytest.raises(CheckpointError, match=r"unexpected \['extra.weight'\]"):
        load_compressed(copy_ckpt)
    _rewrite_weights(
        copy_ckpt,
        lambda t: {
            k: v for k, v in t.items() if k != "extra.weight" and k != "classifier.fc2.bias"
        },
    )
    with pytest.raises(CheckpointError, match=r"missing \['classifier.fc2.bias'\]"):
        load_compressed(copy_ckpt)


def test_stored_gates_are_refused(copy_ckpt, trained):
    gate = "encoder.0.attn.q.gates.0"
    _rewrite_weights(copy_ckpt, lambda t: {**t, gate: torch.ones(3)})
    with pytest.raises(CheckpointError, match="unexpected"):
        load_compressed(copy_ckpt)


def test_shape_mismatch_is_refused(copy_ckpt):
    def grow(t):
        t["classifier.fc2.weight"] = torch.zeros(4, 32)
        return t

    _rewrite_weights(copy_ckpt, grow)
    with pytest.raises(CheckpointError, match=r"classifier.fc2.weight: stored \(4, 32\)"):
        load_compressed(copy_ckpt)


def test_recorded_ranks_must_match_stored_cores(copy_ckpt):
    def bump(man):
        rec = next(r for r in man["layers"] if r["name"] == "encoder.0.attn.q")
        rec["ranks"][1] += 1

    _edit_manifest(copy_ckpt, bump)
    with pytest.raises(CheckpointError, match=r"encoder.0.attn.q.cores.0: stored"):
        load_compressed(copy_ckpt)


def test_modes_and_layer_names_must_match_the_build(copy_ckpt):
    _edit_manifest(copy_ckpt, lambda m: m["layers"][1].update(in_modes=[2, 16]))
    with pytest.raises(CheckpointError, match="in_modes/out_modes"):
        load_compressed(copy_ckpt)
    _edit_manifest(copy_ckpt, lambda m: m["layers"].pop())
    with pytest.raises(CheckpointError, match="tensorized layers do not match"):
        load_compressed(copy_ckpt)


def test_json_safe():
    out = json_safe({"a": torch.tensor(2), "b": (1.5, float("inf")), "c": {"d": None}}, "m")
    assert out == {"a": 2, "b": [1.5, None], "c": {"d": None}}
    json.dumps(out, allow_nan=False)
    with pytest.raises(ValueError, match=r"m.b\[0\] must hold only JSON"):
        json_safe({"b": [b"x"]}, "m")
    with pytest.raises(ValueError, match="m keys must be strings"):
        json_safe({1: 2}, "m")
