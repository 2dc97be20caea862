"""Model directories on the service (``/v1/models``): pack one as a tar and upload it, list,
delete. The tar holds the directory's regular files at its top level (no folders, links,
hidden files such as ``.gitattributes`` or other entries); the service refuses pickles and
code by name and checks the rest before it keeps anything, so nothing else is filtered."""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

from api_schemas import UploadedModelPublic, UploadedModelsPublic
from client.api import ComeraClient

__all__ = ["delete_model", "list_models", "tar_directory", "upload_model"]


def tar_directory(directory: Path, out: Path) -> list[str]:
    """``directory``'s regular files into the tar ``out`` (sorted names, no owners); returns
    the names. Subfolders, links and hidden files are left out."""
    names = sorted(
        p.name
        for p in directory.iterdir()
        if p.is_file() and not p.is_symlink() and not p.name.startswith(".")
    )
    with tarfile.open(out, "w") as tar:
        for name in names:
            info = tar.gettarinfo(str(directory / name), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with (directory / name).open("rb") as fh:
                tar.addfile(info, fh)
    return names


def upload_model(
    client: ComeraClient, directory: Path, name: str | None = None
) -> UploadedModelPublic:
    """``POST /v1/models`` with ``directory`` packed as one tar (streamed from a temporary
    file); the stored model, or a ``ComeraError`` naming what the service refused."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory} is not a directory")
    with tempfile.TemporaryDirectory(prefix="comera-model-") as tmp:
        tar = Path(tmp) / "model.tar"
        tar_directory(directory, tar)
        with tar.open("rb") as body:
            r = client._request(
                "POST",
                "/models",
                params={"name": name or directory.resolve().name},
                content=body,
                headers={"Content-Type": "application/x-tar"},
                timeout=None,  # a large model streams for as long as it takes
            )
    return UploadedModelPublic.model_validate(r.json())


def list_models(client: ComeraClient, limit: int = 200) -> list[UploadedModelPublic]:
    """The tenant's models, newest first (every page, at most ``limit``)."""
    out: list[UploadedModelPublic] = []
    cursor: str | None = None
    while len(out) < limit:
        params = {"limit": min(200, limit - len(out)), **({"cursor": cursor} if cursor else {})}
        page = UploadedModelsPublic.model_validate(
            client._request("GET", "/models", params=params).json()
        )
        out.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    return out


def delete_model(client: ComeraClient, model_id: str) -> None:
    client._request("DELETE", f"/models/{model_id}")
