"""Export round trip: equal logits, only live ranks stored, sizes, no pickle, live model intact."""

from __future__ import annotations

import copy
import hashlib
import json
import struct

import pytest
import torch
from safetensors import safe_open

from engine.export import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    export_compressed,
    load_compressed,
)
from engine.export.manifest import FORMAT, tt_modules
from engine.models.registry import TensorizeOptions, get_workload
from engine.models.transformer import TransformerConfig
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from tests.engine.export.conftest import make_batch
from tests.helpers.assertions import assert_close_rel


def _header_len(path) -> int:
    with open(path, "rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def _built_and_exported(cfg, opts, out, *, tensorized: bool):
    """A freshly built transformer of ``cfg`` (in eval mode) and its export to ``out``."""
    model = get_workload("transformer").build(cfg, tensorized=tensorized, options=opts).eval()
    info = export_compressed(
        model,
        out,
        arch="transformer",
        model_config=cfg.to_dict(),
        options=opts.to_dict(),
        tensorized=tensorized,
    )
    return model, info


def test_round_trip_logits_equal(trained, tmp_path):
    info = export_compressed(trained.model, tmp_path, **trained.export_kwargs())
    loaded, manifest = load_compressed(tmp_path)
    assert not loaded.training
    assert manifest == info.manifest
    ref, got = trained.logits(trained.model), trained.logits(loaded)
    assert ref.abs().max() > 0
    assert_close_rel(got, ref, 1e-6, "loaded vs live logits")
    loaded_tt = tt_modules(loaded)
    for name, mod in tt_modules(trained.model).items():  # layer by layer, gates applied
        with torch.no_grad():
            want, have = mod.to_dense(), loaded_tt[name].to_dense()
        if want.abs().max() == 0:
            assert torch.equal(have, want), name
        else:
            assert_close_rel(have, want, 1e-6, name)


def test_only_active_ranks_stored_and_no_gates(trained, tmp_path):
    info = export_compressed(trained.model, tmp_path, **trained.export_kwargs())
    live = tt_modules(trained.model)
    records = {r["name"]: r for r in info.manifest["layers"]}
    assert set(records) == set(live)
    with safe_open(info.weights_path, framework="pt") as f:
        keys = set(f.keys())
        assert not [k for k in keys if ".gates." in k]
        for name, mod in live.items():
            active = list(mod.active_ranks())
            if 0 in active:  # a bond with no survivor cuts every internal bond
                active = [1] + [0] * (len(active) - 2) + [1]
            assert records[name]["ranks"] == active, name
            for k in range(len(mod.cores)):
                shape = f.get_slice(f"{name}.cores.{k}").get_shape()
                assert (shape[0], shape[-1]) == (active[k], active[k + 1]), (name, k)
    dead = records["encoder.1.attn.v"]["ranks"]
    assert dead[0] == dead[-1] == 1 and set(dead[1:-1]) == {0}
    assert records["encoder.1.attn.v"]["params"] == 0
    assert records["encoder.1.attn.v"]["ratio"] is None
    # the loaded model's gates are ones at the stored ranks
    loaded, _ = load_compressed(tmp_path)
    for name, mod in tt_modules(loaded).items():
        assert list(mod.ranks) == records[name]["ranks"]
        for g in mod.gates:
            assert torch.equal(g, torch.ones_like(g))


def test_file_size_and_counts(trained, tmp_path):
    info = export_compressed(trained.model, tmp_path, **trained.export_kwargs())
    man, weights = info.manifest, info.manifest["weights"]
    with safe_open(info.weights_path, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    stored = sum(t.numel() for t in tensors.values())
    assert man["totals"]["stored_params"] == stored
    assert weights["payload_bytes"] == 4 * stored
    size = info.weights_path.stat().st_size
    assert (
        size
        == info.file_bytes
        == weights["bytes"]
        == 8 + _header_len(info.weights_path) + (4 * stored)
    )
    assert (
        info.sha256
        == weights["sha256"]
        == hashlib.sha256(info.weights_path.read_bytes()).hexdigest()
    )
    # counts against the dense build of the same config (gates never count)
    dense = get_workload("transformer").build(
        trained.config, tensorized=False, options=trained.options
    )
    dense_params = sum(p.numel() for p in dense.parameters())
    totals = man["totals"]
    assert totals["dense_equivalent_params"] == dense_params
    assert totals["model_ratio"] == pytest.approx(dense_params / stored)
    tt = sum(t.numel() for k, t in tensors.items() if ".cores." in k)
    assert totals["tt_params"] == tt
    assert weights["dense_equivalent_bytes"] == 4 * dense_params
    assert weights["file_ratio"] == pytest.approx(4 * dense_params / size)
    for r in man["layers"]:
        mod = tt_modules(trained.model)[r["name"]]
        assert r["dense_params"] == mod.dense_parameters()


def test_paper_size_file_within_five_percent(tmp_path):
    """MNLI shapes: the file is the stored entries x 4 bytes plus a header under 5%."""
    cfg, opts = TransformerConfig.mnli(), TensorizeOptions(max_rank=30, shapes="paper")
    model, info = _built_and_exported(cfg, opts, tmp_path, tensorized=True)
    stored = sum(p.numel() for n, p in model.named_parameters() if ".gates." not in n)
    manifest_bytes = info.manifest_path.stat().st_size
    assert 4 * stored <= info.file_bytes <= 1.05 * 4 * stored
    assert info.file_bytes + manifest_bytes <= 1.05 * 4 * stored
    assert info.manifest["totals"]["dense_equivalent_params"] == 66_957_315
    assert info.manifest["weights"]["file_ratio"] > 40
    # gates all alive at 1: folding is exact, so the loaded tensors equal the live ones
    # (a forward of this size is seconds on CPU; the tiny round trip covers logits)
    loaded, _ = load_compressed(tmp_path)
    want, got = model.state_dict(), loaded.state_dict()
    assert set(want) == set(got)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_bfloat16_export_halves_file_and_loads_rounded_weights(trained, tmp_path):
    full = export_compressed(trained.model, tmp_path / "f32", **trained.export_kwargs())
    half = export_compressed(
        trained.model, tmp_path / "bf16", **trained.export_kwargs(), dtype=torch.bfloat16
    )
    stored = half.manifest["totals"]["stored_params"]
    assert half.manifest["weights"]["payload_bytes"] == 2 * stored
    assert half.manifest["weights"]["storage_dtypes"] == ["bfloat16"]
    assert half.file_bytes < 0.6 * full.file_bytes
    loaded, _ = load_compressed(tmp_path / "bf16")
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    ref, _ = load_compressed(tmp_path / "f32")
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.bfloat16().float())
    torch.testing.assert_close(trained.logits(loaded), trained.logits(ref), rtol=0, atol=0)


def test_live_model_unchanged(trained, tmp_path):
    model = copy.deepcopy(trained.model).train()
    out = get_workload("transformer").forward_loss(model, trained.batch)
    out.loss.backward()  # grads present: export must not touch them either
    before = {
        n: (p, p.detach().clone(), None if p.grad is None else p.grad.clone())
        for n, p in model.named_parameters()
    }
    assert any(g is not None for _, _, g in before.values())
    ranks = {n: (m.ranks, m.active_ranks()) for n, m in tt_modules(model).items()}
    export_compressed(model, tmp_path, **trained.export_kwargs())
    after = dict(model.named_parameters())
    assert set(after) == set(before)
    for n, (p, value, grad) in before.items():
        assert after[n] is p, n
        assert torch.equal(p.detach(), value), n
        assert (p.grad is None) if grad is None else torch.equal(p.grad, grad), n
    assert {n: (m.ranks, m.active_ranks()) for n, m in tt_modules(model).items()} == ranks
    assert model.training


def test_no_pickle_only_two_files(trained, tmp_path):
    info = export_compressed(
        trained.model,
        tmp_path,
        **trained.export_kwargs(),
        metrics={"accuracy": torch.tensor(0.75), "loss": float("nan")},
        extra={"run": "r1", "steps": (1, 2)},
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([MANIFEST_FILE, WEIGHTS_FILE])
    for path in tmp_path.iterdir():
        head = path.read_bytes()[:2]
        assert head[:1] != b"\x80" and head != b"PK", f"{path.name} looks like pickle / zip"
    with safe_open(info.weights_path, framework="pt") as f:
        assert f.metadata()["format"] == "pt"
        keys = set(f.keys())
    want = {k for k in trained.model.state_dict() if ".gates." not in k}
    assert keys == want
    manifest = json.loads(info.manifest_path.read_text())
    assert manifest["metrics"] == {"accuracy": 0.75, "loss": None}
    assert manifest["extra"] == {"run": "r1", "steps": [1, 2]}
    assert manifest["engine_version"] == __import__("engine").__version__


def test_dense_model_exports_and_loads(tmp_path):
    cfg, opts = TransformerConfig.tiny(), TensorizeOptions()
    model, info = _built_and_exported(cfg, opts, tmp_path, tensorized=False)
    totals = info.manifest["totals"]
    n = sum(p.numel() for p in model.parameters())
    assert info.manifest["layers"] == []
    assert totals["stored_params"] == totals["dense_equivalent_params"] == n
    assert totals["tensorized_ratio"] is None and totals["model_ratio"] == 1.0
    loaded, manifest = load_compressed(tmp_path)
    assert manifest["tensorized"] is False
    assert not any(isinstance(m, TTLinear | TTMEmbedding) for m in loaded.modules())
    batch = make_batch(cfg.vocab_size)
    with torch.no_grad():
        args = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        torch.testing.assert_close(loaded(*args), model(*args), rtol=0, atol=0)


def test_float64_model_loads_in_float64(trained, tmp_path):
    model = copy.deepcopy(trained.model).double()
    export_compressed(model, tmp_path, **trained.export_kwargs())
    loaded, manifest = load_compressed(tmp_path)
    assert manifest["dtype"] == "float64"
    assert {p.dtype for p in loaded.parameters()} == {torch.float64}
    assert_close_rel(trained.logits(loaded), trained.logits(model), 1e-12, "float64 round trip")


def test_bad_arguments_write_nothing(trained, tmp_path):
    out = tmp_path / "ckpt"
    kw = trained.export_kwargs()
    with pytest.raises(ValueError, match="model.arch"):
        export_compressed(trained.model, out, **{**kw, "arch": "nope"})
    with pytest.raises(ValueError, match="model.config.bogus"):
        export_compressed(trained.model, out, **{**kw, "model_config": {"bogus": 1}})
    with pytest.raises(ValueError, match="metrics.when must hold only JSON"):
        export_compressed(trained.model, out, **kw, metrics={"when": object()})
    with pytest.raises(ValueError, match="dtype"):
        export_compressed(trained.model, out, **kw, dtype=torch.int8)
    assert not out.exists()


def test_one_model_exports_byte_identical_files(trained, tmp_path):
    """The same tensors give the same bytes and sha256, export after export (safetensors'
    own header order varies from one save to the next)."""
    infos = [
        export_compressed(trained.model, tmp_path / str(i), **trained.export_kwargs())
        for i in range(8)
    ]
    blobs = {info.weights_path.read_bytes() for info in infos}
    assert len(blobs) == 1 and len({info.sha256 for info in infos}) == 1
    [blob] = blobs
    assert infos[0].sha256 == hashlib.sha256(blob).hexdigest()
    header_len = int.from_bytes(blob[:8], "little")
    assert header_len % 8 == 0 and blob[8 : 8 + header_len].startswith(b'{"__metadata__":')
    with safe_open(infos[1].weights_path, "pt") as f:  # the format's own reader takes it
        assert f.metadata() == {"comera": FORMAT, "format": "pt"}
        assert len(f.keys()) > 0 and f.get_tensor(next(iter(f.keys()))).numel() > 0
