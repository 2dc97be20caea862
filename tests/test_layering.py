"""Dependency direction: ``engine`` imports only the standard library, torch and friends."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE_ALLOWED = {
    "engine", "torch", "numpy", "triton", "safetensors", "tokenizers", "rich", "galore_torch",
}


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_engine_imports_no_web_database_or_queue_code():
    offenders = {}
    for path in sorted((ROOT / "engine").rglob("*.py")):
        extra = _top_level_imports(path) - ENGINE_ALLOWED - set(sys.stdlib_module_names)
        if extra:
            offenders[str(path.relative_to(ROOT))] = sorted(extra)
    assert not offenders, f"engine must depend only on {sorted(ENGINE_ALLOWED)}: {offenders}"
