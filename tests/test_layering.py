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


SERVICE_FORBIDDEN = {"torch", "triton", "engine", "worker", "galore_torch", "transformers"}


def test_service_and_api_schemas_never_import_torch_or_the_engine():
    offenders = {}
    for pkg in ("service", "api_schemas"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            bad = _top_level_imports(path) & SERVICE_FORBIDDEN
            if bad:
                offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"service/api_schemas must not import {SERVICE_FORBIDDEN}: {offenders}"


def test_api_schemas_depend_only_on_pydantic():
    allowed = {"api_schemas", "pydantic", "pydantic_core", "typing_extensions"}
    offenders = {}
    for path in sorted((ROOT / "api_schemas").rglob("*.py")):
        extra = _top_level_imports(path) - allowed - set(sys.stdlib_module_names)
        if extra:
            offenders[str(path.relative_to(ROOT))] = sorted(extra)
    assert not offenders, offenders


CLIENT_ALLOWED = {"client", "httpx", "api_schemas", "typer", "rich"}
CLIENT_FORBIDDEN = ("torch", "engine", "service", "worker", "sqlalchemy", "fastapi", "celery")


def _module_level_imports(path: Path) -> set[str]:
    """Imports that run when the module loads (not those inside functions or classes)."""
    names: set[str] = set()
    todo = list(ast.parse(path.read_text(), filename=str(path)).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.If | ast.Try | ast.With):
            todo.extend(ast.iter_child_nodes(node))
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
    return names


def test_client_depends_only_on_httpx_api_schemas_typer_and_rich():
    """The client installs without torch or the server: its modules import only these at load
    time (``comera run`` and the server commands import the engine or service when run)."""
    import subprocess

    offenders = {}
    for path in sorted((ROOT / "client").rglob("*.py")):
        extra = _module_level_imports(path) - CLIENT_ALLOWED - set(sys.stdlib_module_names)
        if extra:
            offenders[str(path.relative_to(ROOT))] = sorted(extra)
    assert not offenders, f"client must depend only on {sorted(CLIENT_ALLOWED)}: {offenders}"
    modules = ", ".join(f"client.{p.stem}" for p in sorted((ROOT / "client").glob("[!_]*.py")))
    probe = (f"import sys, client, {modules}; "
             f"print(sorted(m for m in {CLIENT_FORBIDDEN!r} if m in sys.modules))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]", f"importing the client loaded {done.stdout.strip()}"
