"""English sentences without a network: prose from the docstrings of Python's standard library.

The generator ``stdlib_text`` (for the ``hf_bert`` workload) reads the source of the standard
library modules that ship with the running interpreter (``sysconfig`` ``stdlib`` directory:
every top-level ``*.py`` and the ``*.py`` files one level inside its packages, sorted by path;
``site-packages``, tests, demos and IDLE excluded). Nothing is imported: each file is parsed
with :mod:`ast` and the docstrings of its module, classes and functions are taken.

A docstring is cut into paragraphs at blank lines; a paragraph that looks like code or a
parameter list (``>>>``, ``::``, deeper indentation, ``:param``-style fields) is dropped; the
rest is joined into one line and split into sentences after ``.``/``!``/``?`` followed by a
capital. A sentence is kept when it starts with a capital letter, ends with a full stop, has
``min_words..max_words`` words, is ASCII, and at least 80% of its non-blank characters are
letters (identifiers with ``_``, markup characters and numbers-heavy text are out).
Duplicates (case-insensitive) are removed, keeping the first.

Two sources, so that a model can be measured on text it was never trained on:

* ``source: "docstrings"`` (default): the docstrings above. ``modules`` keeps only files whose
  top-level module name (``email`` for ``email/parser.py``, ``argparse`` for ``argparse.py``)
  matches one of its ``fnmatch`` patterns (default ``["*"]``), so the library can be split by
  module family (e.g. ``["[a-l]*"]`` against ``["[m-z]*"]``).
  ``packages`` (default none) adds the docstrings of those installed Python packages (import
  names, e.g. ``["torch", "sympy", "numpy"]``: every ``*.py`` under the package's directory,
  tests excluded; located by :func:`importlib.util.find_spec`, parsed, never imported), cut
  by the same rules, after the standard library's and deduplicated against them. Technical
  English by other authors: more and more varied text for a distillation (``modules``
  selects the standard library's files only).
* ``source: "reference"``: the Python Language Reference as this interpreter ships it for
  ``help()`` (``pydoc_data.topics``: statements, expressions, the data model), cut into
  sentences by the same rules. Another author, another register: reference prose rather
  than API notes.

* ``source: "comments"``, ``"descriptions"``, ``"jokes"``, ``"questions"``, ``"news"``,
  ``"wikipedia"``: code comments, the installed distributions' descriptions, pyjokes' jokes
  and the Zen of Python, the everyday questions that mimesis ships, the news stories and the
  Wikipedia pages of gensim's test data (:mod:`engine.data.english_text`): English of other
  registers.

``also`` appends the sentences of more sources to the pool (deduplicated), e.g. ``source:
"docstrings"`` with ``also: ["comments", "descriptions"]``: a broad mix to distil on.
``weights`` (a mix only) maps sources to their sentences' odds of being drawn, relative to 1:
``{"questions": 4}`` draws a question four times as readily as a docstring, so a small source
is not drowned by a large one (weighted sampling without replacement; without ``weights``
the draw is the plain shuffle).
``modules`` and ``packages`` select the source files that ``docstrings`` and ``comments``
read, and are refused when neither is in the mix.

Each pool is therefore a pure function of the Python version and the parameters
(``info["python"]`` and ``info["pool_sha256"]`` record it). The draw of train and
validation sentences from a pool: :mod:`engine.data.text_draw`.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import importlib
import importlib.metadata
import importlib.util
import re
import sysconfig
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.configs import ConfigError
from engine.data.config import check_int
from engine.data.english_text import (
    code_comments,
    description_texts,
    joke_texts,
    news_texts,
    question_texts,
    wikipedia_texts,
)
from engine.data.text_cache import cached_pool

__all__ = [
    "StdlibTextParams",
    "stdlib_sentences",
    "tagged_sentences",
    "tagged_pool",
    "docstring_sentences",
    "package_sentences",
    "check_packages",
]

# the code that cuts source files into sentences: a change to it is a new cache entry
_CODE = (Path(__file__), Path(__file__).with_name("english_text.py"))
_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idlelib",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "pydoc_data",
    "__pycache__",
    "__phello__",
}
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_FIELD = re.compile(r"^\s*(:\w+|@\w+|\w+ --|Args:|Returns?:|Raises:|Parameters|-{3,}|={3,})")
_ALLOWED = re.compile(r"^[A-Za-z0-9 ,.;:'\"()?!-]+$")


SOURCES = (
    "docstrings",
    "reference",
    "comments",
    "descriptions",
    "jokes",
    "questions",
    "news",
    "wikipedia",
)
_CODE_SOURCES = ("docstrings", "comments")  # read source files: modules / packages select them
MAX_PATTERNS = 64
MAX_PACKAGES = 16
MAX_WEIGHT = 100.0
MAX_PACKAGE_FILES = 20_000  # over all ``packages`` (torch: 2,282; its parse takes ~15 s)


@dataclass(frozen=True)
class StdlibTextParams:
    min_words: int = 6
    max_words: int = 40
    source: str = "docstrings"
    modules: tuple[str, ...] = ("*",)
    packages: tuple[str, ...] = ()
    also: tuple[str, ...] = ()  # more sources, their sentences appended to the pool
    # {source: weight}: a sentence's odds of being drawn, relative to weight 1 (the default)
    weights: Mapping[str, float] | tuple[tuple[str, float], ...] = ()

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source, *self.also)

    def __post_init__(self) -> None:
        check_int("params.min_words", self.min_words, 1)
        check_int("params.max_words", self.max_words, self.min_words)
        if self.source not in SOURCES:
            raise ConfigError(
                "data.params.source", f"must be one of {list(SOURCES)}, got {self.source!r}"
            )
        also = self.also
        if (
            not isinstance(also, tuple)
            or not all(a in SOURCES for a in also)
            or len(set(self.sources)) != len(self.sources)
        ):
            raise ConfigError(
                "data.params.also",
                f"must list distinct sources of {list(SOURCES)} other than source "
                f"{self.source!r}, got {also!r}",
            )
        object.__setattr__(self, "weights", self._checked_weights())
        code = any(src in _CODE_SOURCES for src in self.sources)
        mods = self.modules
        if (
            not isinstance(mods, tuple)
            or not 0 < len(mods) <= MAX_PATTERNS
            or not all(isinstance(m, str) and 0 < len(m) <= 64 for m in mods)
        ):
            raise ConfigError(
                "data.params.modules",
                f"must be a list of 1-{MAX_PATTERNS} patterns of 1-64 characters, got {mods!r}",
            )
        if not code and mods != ("*",):
            raise ConfigError(
                "data.params.modules",
                f"selects source files: leave it unset with the sources {list(self.sources)}",
            )
        pkgs = self.packages
        if (
            not isinstance(pkgs, tuple)
            or len(pkgs) > MAX_PACKAGES
            or not all(isinstance(p, str) and p.isidentifier() and len(p) <= 64 for p in pkgs)
            or len(set(pkgs)) != len(pkgs)
        ):
            raise ConfigError(
                "data.params.packages",
                f"must be a list of at most {MAX_PACKAGES} distinct package names "
                f"(Python identifiers), got {pkgs!r}",
            )
        if not code and pkgs:
            raise ConfigError(
                "data.params.packages",
                f"adds source files: leave it unset with the sources {list(self.sources)}",
            )

    def _checked_weights(self) -> tuple[tuple[str, float], ...]:
        """``weights`` as sorted ``(source, weight)`` pairs (hashable: the pools are cached),
        each a source of the mix with a weight in (0, MAX_WEIGHT]."""
        weights = self.weights
        try:
            pairs = dict(weights).items() if isinstance(weights, Mapping | tuple) else None
        except (TypeError, ValueError):  # a tuple of something other than pairs
            pairs = None
        ok = pairs is not None and all(
            src in self.sources
            and isinstance(w, int | float)
            and not isinstance(w, bool)
            and 0 < w <= MAX_WEIGHT
            for src, w in pairs
        )
        if not ok or (pairs and not self.also):
            raise ConfigError(
                "data.params.weights",
                f"must map sources of the mix {list(self.sources)} to numbers in "
                f"(0, {MAX_WEIGHT:g}] (a mix: also is set), got {weights!r}",
            )
        return tuple(sorted((src, float(w)) for src, w in pairs))


def _source_files(root: Path) -> list[Path]:
    files = sorted(root.glob("*.py"))
    for pkg in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in _SKIP_DIRS):
        if (pkg / "__init__.py").is_file() and "-" not in pkg.name:
            files.extend(sorted(pkg.glob("*.py")))
    return files


def _docstrings(path: Path) -> list[str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in old modules
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return []
    nodes = [
        tree,
        *(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        ),
    ]
    return [d for n in nodes if (d := ast.get_docstring(n, clean=True))]


def _prose(paragraph: list[str]) -> bool:
    indent = len(paragraph[0]) - len(paragraph[0].lstrip())
    for line in paragraph:
        if line.lstrip().startswith((">>>", "...", "$ ", "%")) or line.rstrip().endswith("::"):
            return False
        if len(line) - len(line.lstrip()) > indent or _FIELD.match(line):
            return False
    return True


def _keep(sentence: str, params: StdlibTextParams) -> bool:
    words = sentence.split()
    if not params.min_words <= len(words) <= params.max_words:
        return False
    if not sentence[0].isupper() or not sentence.endswith(".") or sentence.endswith(".."):
        return False
    if not _ALLOWED.match(sentence):
        return False
    chars = sentence.replace(" ", "")
    return sum(c.isalpha() for c in chars) >= 0.8 * len(chars)


def docstring_sentences(doc: str, params: StdlibTextParams) -> list[str]:
    """The prose sentences of one docstring (see the module docstring for the rules)."""
    out: list[str] = []
    paragraph: list[str] = []
    for line in [*doc.splitlines(), ""]:
        if line.strip():
            paragraph.append(line)
            continue
        if paragraph and _prose(paragraph):
            text = " ".join(" ".join(paragraph).split())
            out.extend(s for s in _SPLIT.split(text) if _keep(s, params))
        paragraph = []
    return out


def _package_files(name: str) -> list[Path]:
    """Every ``*.py`` of the installed package ``name`` (tests and caches excluded), sorted."""
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: found, not imported
    except (ImportError, ValueError):
        spec = None
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    if not dirs:
        raise ConfigError(
            "data.params.packages", f"{name!r} is not an installed package (a directory)"
        )
    files: list[Path] = []
    for d in dirs:
        root = Path(d)
        files += sorted(
            f for f in root.rglob("*.py") if not _SKIP_DIRS.intersection(f.relative_to(root).parts)
        )
    return files


def check_packages(packages: tuple[str, ...]) -> list[Path]:
    """The source files of ``packages`` (listed, not read): each installed, not too many."""
    files = [f for name in packages for f in _package_files(name)]
    if len(files) > MAX_PACKAGE_FILES:
        raise ConfigError(
            "data.params.packages",
            f"{len(files)} source files in {list(packages)}, more than {MAX_PACKAGE_FILES}",
        )
    return files


@functools.lru_cache(maxsize=4)
def package_sentences(
    packages: tuple[str, ...], min_words: int = 6, max_words: int = 40
) -> tuple[str, ...]:
    """The docstring sentences of ``packages`` in order (each deduplicated, the first kept)."""
    files = check_packages(packages)
    params = StdlibTextParams(min_words=min_words, max_words=max_words)
    docs = (doc for path in files for doc in _docstrings(path))
    key = {"packages": packages, "min_words": min_words, "max_words": max_words}
    return cached_pool(
        "package-docstrings", key, files, _CODE, lambda: _new_sentences(docs, params, set())
    )


def _new_sentences(docs: Iterable[str], params: StdlibTextParams, seen: set[str]) -> Iterator[str]:
    """The sentences of ``docs`` in order whose lower case is not in ``seen`` (added to it)."""
    for doc in docs:
        for s in docstring_sentences(doc, params):
            if s.lower() not in seen:
                seen.add(s.lower())
                yield s


def _top_module(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else path.stem


@functools.lru_cache(maxsize=4)
def tagged_sentences(min_words: int = 6, max_words: int = 40) -> tuple[tuple[str, str], ...]:
    """``(top-level module, sentence)`` of every docstring sentence, deduplicated (the first
    occurrence kept), in file order."""
    params = StdlibTextParams(min_words=min_words, max_words=max_words)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = _source_files(root)

    def build() -> list[tuple[str, str]]:
        seen: set[str] = set()
        pool: list[tuple[str, str]] = []
        for path in files:
            module = _top_module(path, root)
            pool += ((module, s) for s in _new_sentences(_docstrings(path), params, seen))
        return pool

    key = {"min_words": min_words, "max_words": max_words}
    return cached_pool("stdlib-docstrings", key, files, _CODE, build)


def _reference_sentences(params: StdlibTextParams) -> tuple[str, ...]:
    topics = importlib.import_module("pydoc_data.topics").topics  # text only, no code run
    return tuple(_new_sentences((topics[key] for key in sorted(topics)), params, set()))


@functools.lru_cache(maxsize=8)
def stdlib_sentences(params: StdlibTextParams = StdlibTextParams()) -> tuple[str, ...]:
    """The deduplicated sentence pool of ``params`` (see the module docstring): each source's
    sentences in its own order, ``source`` first, then those of ``also``."""
    if not params.also:
        return _source_sentences(params.source, params)
    return tuple(s for _, s in tagged_pool(params))


@functools.lru_cache(maxsize=4)
def tagged_pool(params: StdlibTextParams) -> tuple[tuple[str, str], ...]:
    """``(source, sentence)`` of :func:`stdlib_sentences`: the source each sentence was first
    found in."""
    seen: set[str] = set()
    out = []
    for src in params.sources:
        for sentence in _source_sentences(src, params):
            if sentence.lower() not in seen:
                seen.add(sentence.lower())
                out.append((src, sentence))
    return tuple(out)


def _source_sentences(source: str, params: StdlibTextParams) -> tuple[str, ...]:
    if source == "reference":
        return _reference_sentences(params)
    if source == "comments":
        return _comment_sentences(
            params.modules, params.packages, params.min_words, params.max_words
        )
    if source == "descriptions":
        return _description_sentences(params.min_words, params.max_words)
    if source == "jokes":
        return joke_texts(params.min_words, params.max_words)
    if source == "questions":
        return question_texts(params.min_words, params.max_words)
    if source in _PROSE:
        return _prose_sentences(source, params.min_words, params.max_words)
    tagged = tagged_sentences(params.min_words, params.max_words)
    pats = params.modules
    own = [s for m, s in tagged if _selected(m, pats)]
    if not params.packages:
        return tuple(own)
    seen = {s.lower() for s in own}
    more = package_sentences(params.packages, params.min_words, params.max_words)
    return (*own, *(s for s in more if s.lower() not in seen))


def _selected(module: str, patterns: tuple[str, ...]) -> bool:
    return patterns == ("*",) or any(fnmatch.fnmatchcase(module, p) for p in patterns)


@functools.lru_cache(maxsize=4)
def _comment_sentences(
    modules: tuple[str, ...], packages: tuple[str, ...], min_words: int, max_words: int
) -> tuple[str, ...]:
    """The comment sentences of the standard library's files (of ``modules``), then of
    ``packages``' files (:func:`engine.data.english_text.code_comments`)."""
    params = StdlibTextParams(min_words=min_words, max_words=max_words)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in _source_files(root) if _selected(_top_module(f, root), modules)]
    files += check_packages(packages)
    key = {"modules": modules, "packages": packages, "min_words": min_words, "max_words": max_words}
    return cached_pool(
        "comments", key, files, _CODE, lambda: _new_sentences(code_comments(files), params, set())
    )


@functools.lru_cache(maxsize=4)
def _description_sentences(min_words: int, max_words: int) -> tuple[str, ...]:
    params = StdlibTextParams(min_words=min_words, max_words=max_words)
    return tuple(_new_sentences(description_texts(), params, set()))


_PROSE = {"news": news_texts, "wikipedia": wikipedia_texts}  # running prose: cut like docstrings


@functools.lru_cache(maxsize=4)
def _prose_sentences(source: str, min_words: int, max_words: int) -> tuple[str, ...]:
    """The sentences of a source of running prose (:data:`_PROSE`), cut by the docstring rules."""
    params = StdlibTextParams(min_words=min_words, max_words=max_words)
    return tuple(_new_sentences(_PROSE[source](), params, set()))
