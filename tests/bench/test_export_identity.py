"""bench.export_identity's comparison: a differing tensor or field is reported, an excluded
field is not, a header-only change is told from a numeric one."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.export_identity import EXCLUDED, compare_dirs, set_path


def _export(root: Path, weights: dict[str, torch.Tensor], manifest: dict, report: dict) -> Path:
    (root / "model").mkdir(parents=True)
    save_file(weights, str(root / "model" / "model.safetensors"), metadata={"format": "pt"})
    (root / "model" / "manifest.json").write_text(json.dumps(manifest, indent=2))
    (root / "report.json").write_text(json.dumps(report, indent=2))
    return root


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "core.0": torch.randn(2, 3, generator=g),
        "core.1": torch.randn(3, 4, generator=g),
        "ids": torch.arange(5),
    }


MANIFEST = {"arch": "mlp", "layers": [{"name": "fc", "ranks": [1, 3, 1]}], "metrics": {"a": 1}}
REPORT = {"status": "completed", "wall_seconds": 12.5, "steps": 10}


def test_identical_directories(tmp_path):
    a = _export(tmp_path / "a", _tensors(), MANIFEST, REPORT)
    b = _export(tmp_path / "b", _tensors(), MANIFEST, REPORT)
    out = compare_dirs(a, b)
    assert out["export"] == "identical" and out["records"] == "identical"
    assert out["differing_files"] == []
    assert out["excluded_fields_present"] == {"report.json": ["wall_seconds"]}


def test_differing_tensor_is_reported_with_its_max_abs_diff(tmp_path):
    changed = _tensors()
    changed["core.1"] = changed["core.1"].clone()
    changed["core.1"][1, 2] += 0.25
    a = _export(tmp_path / "a", _tensors(), MANIFEST, REPORT)
    b = _export(tmp_path / "b", changed, MANIFEST, REPORT)
    out = compare_dirs(a, b)
    assert out["export"] == "differs"
    assert out["differing_files"] == ["model/model.safetensors"]
    diff = out["files"]["model/model.safetensors"]["tensors_differing"]
    assert list(diff) == ["core.1"]
    assert diff["core.1"]["status"] == "values"
    assert abs(diff["core.1"]["max_abs_diff"] - 0.25) < 1e-6


def test_excluded_field_is_not_reported_but_listed(tmp_path):
    a = _export(tmp_path / "a", _tensors(), MANIFEST, REPORT)
    b = _export(tmp_path / "b", _tensors(), MANIFEST, {**REPORT, "wall_seconds": 99.0})
    for root, secs in ((a, 0.25), (b, 0.5)):
        lines = [{"event": "step", "loss": 1.0, "seconds_per_step": secs}, {"event": "eval"}]
        (root / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = compare_dirs(a, b)
    assert out["export"] == "identical"
    assert out["records"] == "identical_except_excluded_fields"
    assert out["differing_files"] == []
    excluded = out["files"]["report.json"]["excluded_differing"]
    assert [e["field"] for e in excluded] == ["wall_seconds"]
    assert any(f == "report.json" and p == "wall_seconds" for f, p, _ in EXCLUDED)
    steps = out["files"]["metrics.jsonl"]["excluded_differing"]
    assert [e["field"] for e in steps] == ["[0].seconds_per_step"]
    # the loss is no excluded field: a change there is reported
    (b / "metrics.jsonl").write_text(json.dumps({"event": "step", "loss": 2.0}) + "\n")
    fields = compare_dirs(a, b)["files"]["metrics.jsonl"]["fields_differing"]
    assert {"field": "[0].loss", "before": 1.0, "after": 2.0} in fields


def test_other_field_and_layout_only_change(tmp_path):
    manifest = json.loads(json.dumps(MANIFEST))
    set_path(manifest, "layers[0].ranks[1]", 2)
    a = _export(tmp_path / "a", _tensors(), MANIFEST, REPORT)
    b = _export(tmp_path / "b", dict(reversed(list(_tensors().items()))), manifest, REPORT)
    # same tensors, other metadata: a layout change, not a numeric one
    save_file(_tensors(), str(b / "model" / "model.safetensors"), metadata={"format": "x"})
    out = compare_dirs(a, b)
    assert out["export"] == "differs"
    fields = out["files"]["model/manifest.json"]["fields_differing"]
    assert fields == [{"field": "layers[0].ranks[1]", "before": 3, "after": 2}]
    weights = out["files"]["model/model.safetensors"]
    assert weights["tensors_differing"] == {}
    assert weights["metadata_differing"] == [
        {"field": "metadata.format", "before": "pt", "after": "x"}
    ]


def test_missing_file_is_reported(tmp_path):
    a = _export(tmp_path / "a", _tensors(), MANIFEST, REPORT)
    b = _export(tmp_path / "b", _tensors(), MANIFEST, REPORT)
    (b / "model" / "hf").mkdir()
    (b / "model" / "hf" / "config.json").write_text("{}")
    out = compare_dirs(a, b)
    assert out["export"] == "differs"
    assert out["files"]["model/hf/config.json"] == {"status": "only_after"}
