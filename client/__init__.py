"""The CoMERA service client: a Python API (``ComeraClient``) and the ``comera`` command line.

Depends only on httpx, ``api_schemas``, typer and rich, so it installs without torch or the
server; the commands that need more (``comera run``, ``comera up``) import it when run.
"""

from client.api import ComeraClient, DownloadResult
from client.errors import ChecksumMismatch, ComeraError

__all__ = ["ChecksumMismatch", "ComeraClient", "ComeraError", "DownloadResult"]
