"""A model directory's files are checked at submission as the worker's libraries will read
them, every refusal names ``/model/source/path``, and no problem names a server path
(docs/input-limits.md#model-directories-hf_dir).

Before: a safetensors header declaring an unknown dtype, or a 40 GB tensor over zero bytes,
passed the API and failed the job in the worker (pointing at ``/compression``); a garbage
``tokenizer.json`` was a 422 at ``/dataset`` whose detail held the data root's absolute path.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open
from safetensors.torch import _SIZE, _TYPES

from api_schemas.engine_spec import engine_pointer
from engine.configs import ConfigError
from service.errors import FieldProblem
from service.store.model_files import DTYPE_BYTES, SPECIAL_TOKENS
from tests.helpers.hf_dirs import write_bert_dir
from tests.helpers.specs import (
    engine_job,
    finetune_stage,
    hf_dir,
    model_spec,
    synthetic_data,
    synthetic_dataset,
    text_data,
)
from tests.service.api_helpers import Api, job_body
from worker.plan import plan_job

POINTER = "/model/source/path"


def _body(path: str, dataset: dict[str, Any] | None = None) -> dict[str, Any]:
    return job_body(
        model=model_spec("hf_bert", source=hf_dir(path)),
        dataset=dataset or synthetic_dataset("stdlib_text", max_len=16),
    )


def _refused(api: Api, path: str, *words: str) -> None:
    """Both submission routes: a 422 naming the model source, ``words`` in its message, and
    no server directory anywhere in the problem."""
    for url in ("/v1/jobs:validate", "/v1/jobs"):
        resp = api.client.post(url, json=_body(path))
        assert resp.status_code == 422, resp.text
        problem = resp.json()
        (error,) = problem["errors"]
        assert error["pointer"] == POINTER, problem
        assert all(w in error["message"] for w in words), problem
        assert str(api.settings.home) not in resp.text and "/tmp/" not in resp.text
        assert path in error["message"]  # named relative to the data root


def _rewrite(file: Path, change, extra: bytes = b"") -> None:
    """``model.safetensors`` with its header changed by ``change(header)``, the data kept."""
    raw = file.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    change(header)
    text = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :] + extra)


def _first(header: dict[str, Any]) -> dict[str, Any]:
    return next(v for k, v in header.items() if k != "__metadata__")


def _last_end(header: dict[str, Any]) -> int:
    return max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")


def _library_refuses(file: Path) -> bool:
    try:
        with safe_open(str(file), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                f.get_slice(key)
    except Exception:  # noqa: BLE001 (the library's own error types)
        return True
    return False


def test_safetensors_tensors_are_checked_as_the_loader_reads_them(api: Api):
    root = Path(api.settings.data)

    def unknown(h):
        _first(h)["dtype"] = "F128"

    def huge(h):  # 40 GB declared over zero bytes
        end = _last_end(h)
        h["huge"] = {"dtype": "F32", "shape": [10_000_000_000], "data_offsets": [end, end]}

    def bigger(h):  # a shape larger than its range
        _first(h)["shape"] = [s * 2 for s in _first(h)["shape"]]

    def gap(h):
        for v in h.values():
            if isinstance(v, dict) and "data_offsets" in v:
                v["data_offsets"] = [v["data_offsets"][0] + 4, v["data_offsets"][1] + 4]

    cases = {
        "unknown-dtype": (unknown, b"", ("unknown dtype", "'F128'")),
        "huge": (huge, b"", ("'huge'", "40,000,000,000 bytes", "range of 0 bytes")),
        "bigger": (bigger, b"", ("declares",)),
        "gap": (gap, b"\0" * 4, ("starts at byte 4", "expected 0")),
        "trailing": (lambda h: None, b"\0" * 64, ("the file holds",)),
    }
    for name, (change, extra, words) in cases.items():
        directory = write_bert_dir(root / "models" / name)
        _rewrite(directory / "model.safetensors", change, extra)
        assert _library_refuses(directory / "model.safetensors"), name  # what the worker sees
        _refused(api, f"models/{name}", "model.safetensors", *words)
    good = write_bert_dir(root / "models" / "good")
    assert not _library_refuses(good / "model.safetensors")


def test_the_dtypes_are_the_loaders(api_lite: Api):
    assert DTYPE_BYTES == {name: _SIZE[dtype] for name, dtype in _TYPES.items()}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("garbage", ("not a tokenizer", "not valid JSON")),
        ("[" * 5000, ("nested deeper than 64 levels",)),
        ('{"model": 1}', ("no model with a vocabulary",)),
        ('{"model": {"vocab": {"a": 0}}}', ("lacks the special tokens", "[PAD]")),
    ],
    ids=["garbage", "deep", "no-vocab", "no-specials"],
)
def test_a_bad_tokenizer_is_a_422_at_the_model_source(api: Api, content: str, words):
    directory = write_bert_dir(Path(api.settings.data) / "models" / "tok")
    (directory / "tokenizer.json").write_text(content)
    _refused(api, "models/tok", "tokenizer.json", *words)


def test_the_special_tokens_are_the_engines():
    from engine.data.tokenizer import SPECIAL_TOKENS as ENGINE_TOKENS

    assert SPECIAL_TOKENS == ENGINE_TOKENS


@pytest.mark.parametrize("kind", ["synthetic", "text"])
def test_the_planner_loads_the_tokenizer_and_names_the_model(tmp_path: Path, kind: str):
    """What the library refuses beyond the API's check: a ``ConfigError`` on the model's path
    (the submitted ``/model/source/path``), for generated sentences and text files alike."""
    directory = write_bert_dir(tmp_path / "models" / "tok")
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    (directory / "tokenizer.json").write_text(json.dumps({"model": {"type": "?", "vocab": vocab}}))
    (tmp_path / "train.txt").write_text("one sentence\nanother sentence\n" * 8)
    data = (
        synthetic_data("stdlib_text", n_train=16, n_valid=4)
        if kind == "synthetic"
        else text_data(tmp_path / "train.txt", valid_every=4)
    )
    job = engine_job(
        model=model_spec("hf_bert", {"path": str(directory)}),
        data={**data, "max_len": 16},
        schedule=[finetune_stage(steps=2)],
        training={"batch_size": 8},
    )
    with pytest.raises(ConfigError) as caught:
        plan_job(job)
    assert caught.value.field == "model.config.path"
    assert "tokenizer.json" in caught.value.message and str(tmp_path) not in str(caught.value)
    spec = _body("models/tok")
    assert engine_pointer(caught.value.field, spec) == POINTER


def test_no_problem_names_a_server_directory(api_lite: Api):
    """Whatever check wrote a server path into its message, the problem names it relative to
    the data root."""
    settings = api_lite.settings
    app = api_lite.client.app

    def leaky() -> None:
        where = f"{settings.data.resolve()}/models/x and {settings.artifacts}/jobs/y"
        raise FieldProblem.one(POINTER, f"cannot read {where}")

    app.add_api_route("/test-leaky", leaky)
    problem = api_lite.client.get("/test-leaky").json()
    assert problem["detail"] == f"{POINTER}: cannot read models/x and jobs/y"
    assert problem["errors"][0]["message"] == "cannot read models/x and jobs/y"
