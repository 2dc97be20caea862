"""Dependency direction and import cycles, read from the AST of every file.

The rules, exactly:

1. ``engine`` imports only the standard library and :data:`ENGINE_ALLOWED` (``ray`` inside the
   functions of ``engine/train/ray_driver.py`` only);
2. ``api_schemas`` imports only itself, pydantic and the standard library; ``api_schemas`` and
   ``service`` never import torch, triton, the engine or the worker, except :data:`UPWARD`;
3. ``client`` imports only :data:`CLIENT_ALLOWED` when a module loads (``comera run`` and the
   server commands import the engine or the service inside functions);
4. first-party packages import only downwards (:data:`MAY_IMPORT`), and the rules hold for
   imports by string too (``importlib.import_module("...")``, ``__import__``, whose module must
   be a literal) and for ``sys.modules`` look-ups;
5. a module another program loads by name (``python -m``, ``celery -A``, Celery's
   ``include``, uvicorn's app factory) is named by a string only where :data:`ENTRY_POINTS`
   lists it;
6. no import cycle between modules of the repository (statements at any depth, functions
   included, ``if TYPE_CHECKING:`` blocks excluded; an import names the module it reads, not
   its parent packages), except the engine's :data:`KNOWN_CYCLES`, which may only go.
7. of ``service``, the worker imports only the shared job store, :data:`STORE`
   (``service.store`` and its submodules), and the workers' remote control, :data:`CONTROL`;
   the store imports nothing of ``service`` outside itself (:data:`CONTROL` least of all: it
   keeps only the interface) and none of :data:`WEB`, and :data:`CONTROL` imports nothing of
   ``service`` but the store and none of :data:`WEB` (by statement, by string and by
   ``sys.modules`` look-up).
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE_ALLOWED = {
    "engine",
    "torch",
    "numpy",
    "triton",
    "safetensors",
    "tokenizers",
    "rich",
    "galore_torch",
    "transformers",  # the hf workload builds models with transformers' own classes
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


# optional extras: imported inside functions of these modules only, never when engine loads
ENGINE_OPTIONAL = {"engine/train/ray_driver.py": {"ray"}}


def test_engine_imports_no_web_database_or_queue_code():
    offenders = {}
    for path in sorted((ROOT / "engine").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        optional = ENGINE_OPTIONAL.get(rel, set())
        extra = _top_level_imports(path) - ENGINE_ALLOWED - set(sys.stdlib_module_names) - optional
        extra |= _module_level_imports(path) & optional
        if extra:
            offenders[rel] = sorted(extra)
    assert not offenders, f"engine must depend only on {sorted(ENGINE_ALLOWED)}: {offenders}"


SERVICE_FORBIDDEN = {"torch", "triton", "engine", "worker", "galore_torch", "transformers"}
# The one upward import: the planner's spawned child plans a job with worker.plan (the model on
# torch's meta device); imported inside the functions the child runs, never by the API process.
UPWARD = {"service/planner_child.py": {"worker.plan"}}


def test_service_and_api_schemas_never_import_torch_or_the_engine():
    offenders = {}
    for pkg in ("service", "api_schemas"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            allowed = UPWARD.get(rel, set())
            bad = _top_level_imports(path) & SERVICE_FORBIDDEN
            bad -= {i.module.split(".")[0] for i in _imports(path) if i.module in allowed}
            bad |= {m.split(".")[0] for m in _module_level_imports(path) & allowed}
            if bad:
                offenders[rel] = sorted(bad)
    assert not offenders, f"service/api_schemas must not import {SERVICE_FORBIDDEN}: {offenders}"


def test_the_upward_import_is_inside_functions_only():
    for rel, modules in UPWARD.items():
        found = [i for i in _imports(ROOT / rel) if i.module in modules]
        assert found, f"{rel} no longer imports {modules}: drop it from UPWARD"
        assert not [i for i in found if i.module_level], f"{rel}: {modules} at module level"


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
    from tests.helpers.services import run_python

    offenders = {}
    for path in sorted((ROOT / "client").rglob("*.py")):
        extra = _module_level_imports(path) - CLIENT_ALLOWED - set(sys.stdlib_module_names)
        if extra:
            offenders[str(path.relative_to(ROOT))] = sorted(extra)
    assert not offenders, f"client must depend only on {sorted(CLIENT_ALLOWED)}: {offenders}"
    modules = ", ".join(f"client.{p.stem}" for p in sorted((ROOT / "client").glob("[!_]*.py")))
    probe = (
        f"import sys, client, {modules}; "
        f"print(sorted(m for m in {CLIENT_FORBIDDEN!r} if m in sys.modules))"
    )
    done = run_python("-c", probe, cwd=ROOT, timeout=60, check=True)
    assert done.stdout.strip() == "[]", f"importing the client loaded {done.stdout.strip()}"


# -- every import, by statement or by string -----------------------------------------------------
LAYERED = ("api_schemas", "client", "engine", "service", "worker")
FIRST_PARTY = (*LAYERED, "bench", "examples", "migrations", "scripts", "tests")
# first-party packages each layered package may import (rule 4); anything else is third party
MAY_IMPORT = {
    "api_schemas": {"api_schemas"},
    "engine": {"engine"},
    "service": {"service", "api_schemas"},
    "worker": {"worker", "service", "api_schemas", "engine"},
    "client": {"client", "api_schemas", "engine", "service"},  # the last two: rule 3
}
# Modules other programs load by name, in processes of their own (rule 5): nothing is imported
# where the string is, so the direction rules do not apply; each is listed with why.
ENTRY_POINTS = {
    ("engine/train/launch.py", "engine.train"): "python -m engine.train, per rank, by torchrun",
    ("engine/train/ray_launch.py", "engine.train.ray_driver"): "python -m: the Ray driver",
    ("service/cli.py", "worker.celery_app"): "celery -A: the worker processes comera starts",
    ("service/cli.py", "service.main:create_app"): "uvicorn's app factory (--workers > 1)",
    ("worker/celery_app.py", "worker.tasks"): "Celery's include: the task module it loads",
    ("worker/process_baseline.py", "worker.process_baseline"): "python -m: the baseline probe",
}
# Import cycles inside the engine that are tolerated until removed (the last one, through the
# package root and the modules that read engine.__version__, went with engine.version).
# A listed cycle that is gone fails the test: remove it from here.
KNOWN_CYCLES: set[frozenset[str]] = set()  # none left (engine.version broke the last)
IMPORT_CALLS = {"import_module", "__import__", "run_module"}
MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?$")


@dataclass(frozen=True)
class Import:
    module: str  # absolute dotted name, as written (a from-import: ``module.name`` when a module)
    line: int
    module_level: bool  # runs when the file loads (not inside a function)
    by_string: bool = False  # importlib.import_module / __import__ / runpy.run_module


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files(packages: tuple[str, ...]) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


MODULES = {_module_of(p) for p in _files(FIRST_PARTY)}


def _exists(name: str) -> bool:
    return name.split(":")[0] in MODULES


def _resolve(name: str) -> str | None:
    """The repository module ``name`` reads: itself or its longest existing prefix."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def _imports(path: Path) -> list[Import]:
    return _imports_in(_tree(path), _module_of(path), path.name == "__init__.py")


def _imports_in(tree: ast.Module, module: str, is_package: bool) -> list[Import]:
    """Every import of ``module`` that runs (``if TYPE_CHECKING:`` bodies left out), by statement
    or by a string passed to an import function (a computed name is an assertion error)."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child, module_level)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            module_level = False
        if isinstance(node, ast.Import):
            out.extend(Import(a.name, node.lineno, module_level) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                name = full if full in MODULES else base
                out.append(Import(name, node.lineno, module_level))
        elif isinstance(node, ast.Call) and _call_name(node) in IMPORT_CALLS:
            arg = node.args[0] if node.args else None
            where = f"{module}:{node.lineno}"
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), (
                f"{where}: {_call_name(node)} of a computed name: the layering cannot check it"
            )
            out.append(Import(arg.value, node.lineno, module_level, by_string=True))
        for child in ast.iter_child_nodes(node):
            visit(child, module_level)

    visit(tree, True)
    return out


def _is_sys_modules(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _named_modules(path: Path) -> Iterator[tuple[str, int, bool]]:
    """Strings naming a repository module: ``(name, line, is a sys.modules look-up)``, those
    passed to an import function left out (they are imports)."""
    tree = _tree(path)
    lookups: set[int] = set()
    imported: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            if isinstance(node.func, ast.Attribute) and _is_sys_modules(node.func.value):
                lookups.add(id(node.args[0]))
            if _call_name(node) in IMPORT_CALLS:
                imported.add(id(node.args[0]))
        elif isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
            lookups.add(id(node.slice))
        elif isinstance(node, ast.Compare) and any(_is_sys_modules(c) for c in node.comparators):
            lookups.add(id(node.left))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in imported
            and MODULE_NAME.match(node.value)
            and node.value.split(".")[0] in FIRST_PARTY
            and _exists(node.value)
        ):
            yield node.value, node.lineno, id(node) in lookups


def _targets(path: Path) -> list[tuple[str, int, str]]:
    """What ``path`` imports or looks up in ``sys.modules``: ``(module, line, how)``."""
    targets = [(i.module, i.line, "string" if i.by_string else "import") for i in _imports(path)]
    targets += [(m, line, "sys.modules") for m, line, lookup in _named_modules(path) if lookup]
    return targets


def test_first_party_imports_go_downwards_by_statement_by_string_and_by_lookup():
    """Rule 4: a layered package imports (or looks up in ``sys.modules``) only the first-party
    packages :data:`MAY_IMPORT` gives it, :data:`UPWARD` apart."""
    offenders = []
    for path in _files(LAYERED):
        rel, pkg = str(path.relative_to(ROOT)), path.relative_to(ROOT).parts[0]
        allowed = MAY_IMPORT[pkg]
        for target, line, how in _targets(path):
            top = target.split(".")[0]
            if top in FIRST_PARTY and top not in allowed and target not in UPWARD.get(rel, ()):
                offenders.append(f"{rel}:{line}: {how} {target}")
    assert not offenders, "imports against the direction:\n" + "\n".join(offenders)


# The job store the API and the worker share (rule 7): the worker reaches the service only here,
# and the store is no part of the web app.
STORE = "service.store"
# The workers' remote control (Celery's inspect/revoke, /proc for ``comera up``): the worker may
# import it as well, because its beat task (``comera.reap``) runs the reaper and passes it the
# broker-wide control. The store must not import it: the reaper keeps only the interface
# (``service.store.reaper.TaskControl``) and its callers choose the implementation.
CONTROL = "service.task_control"
WEB = {"fastapi", "starlette", "uvicorn"}


def _in_store(module: str) -> bool:
    return module == STORE or module.startswith(f"{STORE}.")


def test_the_worker_imports_only_the_store_and_the_store_nothing_of_the_web_app():
    """Rule 7, by statement, by string and by ``sys.modules`` look-up, at any depth."""
    assert (ROOT / STORE.replace(".", "/") / "__init__.py").is_file()
    assert (ROOT / f"{CONTROL.replace('.', '/')}.py").is_file()
    offenders = []
    for path in _files(("worker", "service")):
        rel, module = str(path.relative_to(ROOT)), _module_of(path)
        in_store, is_control = _in_store(module), module == CONTROL
        if not (in_store or is_control or rel.startswith("worker/")):
            continue
        shared = {CONTROL} if rel.startswith("worker/") else set()  # not to the store itself
        for target, line, how in _targets(path):
            top = target.split(".")[0]
            outside = top == "service" and not _in_store(target) and target not in shared
            if outside or ((in_store or is_control) and top in WEB):
                offenders.append(f"{rel}:{line}: {how} {target}")
    assert not offenders, (
        f"only {STORE} (and {CONTROL}, for the worker) is shared, and neither is the web app:\n"
        + "\n".join(offenders)
    )


def test_the_store_keeps_only_the_remote_controls_interface():
    """Rule 7's point for :data:`CONTROL`: no module of the store imports it (at any depth, by
    string or look-up too), and the reaper's control has no default: each caller passes one."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {how} {target}"
        for path in _files(("service",))
        if _in_store(_module_of(path))
        for target, line, how in _targets(path)
        if target == CONTROL or target.startswith(f"{CONTROL}.")
    ]
    assert not offenders, f"the store imports {CONTROL}:\n" + "\n".join(offenders)
    tree = _tree(ROOT / "service/store/reaper.py")
    reaper = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert isinstance(reaper.get("TaskControl"), ast.ClassDef), "the interface left the reaper"
    [init] = [n for n in reaper["ReaperThread"].body if getattr(n, "name", "") == "__init__"]
    for where, fn in (("reap_once", reaper["reap_once"]), ("ReaperThread", init)):
        args = fn.args
        defaults = dict(zip([a.arg for a in args.kwonlyargs], args.kw_defaults, strict=True))
        assert "control" in defaults and defaults["control"] is None, f"{where}: a default control"


def test_string_imports_are_seen():
    """The walker sees the forms a string import takes (the rules above depend on it)."""
    source = (
        "import importlib\nfrom importlib import import_module\n"
        "def f():\n    importlib.import_module('worker.plan')\n    __import__('engine.train')\n"
        "import_module('service.main')\n"
    )
    imports = _imports_in(ast.parse(source), "service.probe", is_package=False)
    seen = {(i.module, i.module_level) for i in imports if i.by_string}
    assert seen == {("worker.plan", False), ("engine.train", False), ("service.main", True)}


def test_modules_named_by_string_are_listed_entry_points():
    """Rule 5: a string naming a repository module, other than an import or a ``sys.modules``
    look-up, is an entry point of another program, and every one is in :data:`ENTRY_POINTS`."""
    named = {
        (str(path.relative_to(ROOT)), name)
        for path in _files(LAYERED)
        for name, _, lookup in _named_modules(path)
        if not lookup
    }
    unlisted = sorted(named - set(ENTRY_POINTS))
    assert not unlisted, f"modules named by string, not in ENTRY_POINTS: {unlisted}"
    stale = sorted(set(ENTRY_POINTS) - named)
    assert not stale, f"ENTRY_POINTS no longer named there: {stale}"


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _files(FIRST_PARTY):
        module = _module_of(path)
        edges = {_resolve(i.module) for i in _imports(path)}
        graph[module] = {e for e in edges if e is not None and e != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(frozenset(members))
    return found


def _one_cycle(graph: dict[str, set[str]], members: frozenset[str]) -> list[str]:
    """A concrete cycle through the component: ``a -> b -> ... -> a``."""
    start = min(members)
    path, seen = [start], {start}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = [m for m in nxt if m in seen]
        if back:
            return path[path.index(back[0]) :] + [back[0]]
        path.append(next(m for m in nxt if m not in seen))
        seen.add(path[-1])


def test_no_import_cycles():
    """Rule 6, over every module of the repository."""
    graph = _graph()
    cycles = _cycles(graph)
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(" -> ".join(_one_cycle(graph, c)) for c in new)
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"these cycles are gone, remove them from KNOWN_CYCLES: {gone}"


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset("abc")]
    assert _one_cycle(graph, frozenset("abc")) == ["a", "b", "c", "a"]
