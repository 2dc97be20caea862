"""``comera models upload / list / delete`` against a real ``comera up``: a tiny LLaMA directory
packed as one tar and checked by the service; a directory with pickled weights is refused with
the file's name and exit status 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.client.test_cli import comera
from tests.helpers.groups import CLIENT
from tests.helpers.hf_models import make_model_dir

pytestmark = [pytest.mark.slow, CLIENT]


def test_upload_list_and_delete_a_model_directory(server, tmp_path: Path):
    llama = make_model_dir(tmp_path, "llama")
    (llama / ".gitattributes").write_text("*.safetensors filter=lfs\n")  # left out
    up = comera(server, "models", "upload", str(llama), "--name", "tiny", "--json")
    assert up.exit_code == 0, up.output
    model = json.loads(up.output)
    assert model["model_type"] == "llama" and model["name"] == "tiny"
    assert model["id"].startswith("mdl_")
    listed = comera(server, "models", "list")
    assert listed.exit_code == 0 and model["id"] in listed.output and "llama" in listed.output

    (llama / "pytorch_model.bin").write_bytes(b"\x80\x04.")
    refused = comera(server, "models", "upload", str(llama))
    assert refused.exit_code == 1 and "pytorch_model.bin" in refused.output

    gone = comera(server, "models", "delete", model["id"])
    assert gone.exit_code == 0, gone.output
    assert model["id"] not in comera(server, "models", "list", "--json").output
    assert comera(server, "models", "delete", model["id"]).exit_code == 1  # 404
