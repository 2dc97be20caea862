"""The one error of the upload checks (:mod:`service.upload_checks`, :mod:`service.upload_npz`)."""

from __future__ import annotations

__all__ = ["UploadRejected"]


class UploadRejected(ValueError):
    """The file is not what its declared format says; the message says why and where."""
