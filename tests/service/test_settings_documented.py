"""Every setting an operator can set is documented: each field of ``Settings`` appears as its
environment variable in the settings table of docs/service.md (a new setting without a row
there fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from service.store.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "service.md"


def test_every_setting_has_a_row_in_the_settings_table():
    text = DOC.read_text(encoding="utf-8")
    table = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`COMERA_([A-Z0-9_]+)`", table))
    wanted = {name.upper() for name in Settings.model_fields}
    assert wanted - documented == set(), "settings missing from docs/service.md#settings"
    assert documented - wanted == set(), "rows for settings that do not exist"
