"""The first command's summary (``examples/service/run_embedded.py``): the dense twin it trains
with ``--baseline`` is the dense baseline the service's report looks for, and the summary
labels the accuracy (beside the dense baseline's and chance), the tensorized layers' ratio and
the whole model's."""

from __future__ import annotations

import importlib.util
import json
from types import ModuleType

from api_schemas import JobCreate
from service.baseline import baseline_key
from tests.helpers.services import ROOT

SPEC = ROOT / "examples/service/nli_job.json"


def _demo() -> ModuleType:
    path = ROOT / "examples/service/run_embedded.py"
    spec = importlib.util.spec_from_file_location("run_embedded", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dense_twin_is_the_baseline_the_report_finds():
    job = json.loads(SPEC.read_text())
    twin = _demo().dense_twin(job)
    JobCreate.model_validate(twin)  # the service accepts it
    assert twin["compression"] == {"method": "dense"}
    assert {s["kind"] for s in twin["schedule"]} == {"early"}
    assert baseline_key(twin) == baseline_key(job) is not None


def _report(baseline: dict | None) -> dict:
    return {
        "metrics": {"loss": 0.01, "accuracy": 1.0},
        "baseline": baseline,
        "chance": {"chance": 0.338},
        "tensorized_ratio": 12.47,
        "model_ratio": 1.562,
        "params": 53_639,
        "params_dense": 83_779,
        "file_ratio": 1.53,
        "file_bytes": 219_244,
        "dense_bytes": 335_116,
        "layers": [
            {"name": "encoder.0.ffn.fc1", "dense_params": 8192, "params": 1176},
            {"name": "encoder.0.ffn.fc2", "dense_params": 8192, "params": 456},
        ],
    }


def test_the_summary_labels_accuracy_baseline_and_both_ratios():
    summary = _demo().summary
    base = {"job_id": "job_d", "metrics": {"accuracy": 0.6635}, "deltas": {}}
    accuracy, layers, model, file = summary(_report(base))
    assert accuracy.split()[:4] == ["accuracy", "1.0000", "compressed", "vs"]
    assert "0.6635 dense baseline (job_d" in accuracy and accuracy.endswith("chance 0.34")
    assert "validation split" in accuracy
    assert layers.split()[:3] == ["tensorized", "layers", "x12.5"]
    assert "2 layers in TT form, 16,384 -> 1,632 parameters" in layers
    assert model.split()[:3] == ["whole", "model", "x1.56"]
    assert "83,779 -> 53,639 parameters" in model
    assert file.split()[:3] == ["saved", "file", "x1.53"]

    alone = summary(_report(None))[0]
    assert "no dense baseline trained in this run: --baseline trains one" in alone
