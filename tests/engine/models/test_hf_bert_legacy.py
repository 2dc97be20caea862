"""A compact checkpoint written by the earlier hand-written ``hf_bert`` encoder loads into the
encoder on transformers' ``BertModel`` and gives the embeddings that encoder gave.

``data/hf_bert_legacy/`` was exported by that encoder (a tiny random BERT, every linear and the
word embeddings in TT form, after a short early / late / finetune job); ``expected.safetensors``
holds its embeddings of three fixed sentences, computed by that encoder at export time.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.export import CheckpointError, load_compressed
from engine.models.hf_bert.legacy import is_legacy, new_name, upgrade_names

LEGACY = Path(__file__).parent / "data" / "hf_bert_legacy"


def test_the_earlier_encoders_checkpoint_gives_its_embeddings() -> None:
    model, manifest = load_compressed(LEGACY)
    expected = load_file(LEGACY / "expected.safetensors")
    ids, mask = expected["input_ids"], expected["attention_mask"].bool()  # (3, 10) each
    with torch.no_grad():
        got = model.embed(ids, mask, torch.zeros_like(ids))  # (3, 32)
    torch.testing.assert_close(got, expected["embeddings"], rtol=1e-5, atol=1e-6)
    names = {row["name"] for row in manifest["layers"]}
    assert "encoder.layer.1.attention.self.query" in names and "encoder.1.attn.q" not in names


def test_names_map_one_to_one_onto_bert_models() -> None:
    tensors = load_file(LEGACY / "model.safetensors")
    assert is_legacy(tensors)
    model, _ = load_compressed(LEGACY)
    renamed = {new_name(k) for k in tensors}
    assert len(renamed) == len(tensors)
    assert renamed <= set(model.state_dict())  # every weight lands on a module of BertModel
    assert new_name("encoder.0.norm2.weight") == "encoder.layer.0.output.LayerNorm.weight"
    assert new_name("embeddings.word.cores.1") == "embeddings.word_embeddings.cores.1"
    assert new_name("encoder.layer.0.output.dense.bias") == "encoder.layer.0.output.dense.bias"


def test_a_checkpoint_under_todays_names_is_left_alone() -> None:
    manifest = {"layers": [{"name": "encoder.layer.0.output.dense"}]}
    tensors = {"embeddings.LayerNorm.weight": torch.ones(2)}
    assert upgrade_names(manifest, tensors) == (manifest, tensors)


def test_a_legacy_checkpoint_is_still_checked_strictly(tmp_path: Path) -> None:
    """A wrong shape under an earlier name is refused, named under today's name."""
    bad = shutil.copytree(LEGACY, tmp_path / "bad")
    tensors = load_file(bad / "model.safetensors")
    tensors["encoder.0.attn.q.bias"] = torch.zeros(3)  # (3,), the layer has 32 outputs
    save_file(tensors, bad / "model.safetensors")
    blob = (bad / "model.safetensors").read_bytes()
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["weights"].update(bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.0\.attention\.self\.query\.bias"):
        load_compressed(bad)
