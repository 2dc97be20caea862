"""The settings of the server's commands (``comera up|api|worker|reaper|keys``), read once.

Shared by :mod:`service.cli` and :mod:`service.keys_cli`, so neither imports the other's
internals: an invalid variable ends the command with exit status 2, naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from pydantic import ValidationError

from service.store.settings import Settings

__all__ = ["load_settings"]


def load_settings(home: Path | None = None) -> Settings:
    """The settings from the environment (``home`` sets ``COMERA_HOME`` first); invalid ones
    are printed as ``COMERA_<NAME>: why`` and the command exits with status 2."""
    if home is not None:
        os.environ["COMERA_HOME"] = str(home.resolve())
    try:
        return Settings()
    except ValidationError as err:  # fail fast, naming the variable
        lines = [
            f"  COMERA_{'_'.join(map(str, e['loc'])).upper() or '?'}: {e['msg']}"
            for e in err.errors()
        ]
        typer.echo("invalid settings:\n" + "\n".join(lines), err=True)
        raise typer.Exit(2) from None
