"""English text beyond docstrings, all of it installed with the interpreter and the packages.

Five more sources of :mod:`engine.data.stdlib_text`, each another register of English:

* ``comments``: the ``#`` comments of the standard library's source files (the files
  ``docstrings`` reads; with ``packages``, those packages' files too). Consecutive comment
  lines are one paragraph (a blank line or code ends it); cut into sentences by the
  docstring rules. Informal notes by
  hundreds of authors ("We have to assume that we must decode this string.").
* ``descriptions``: the long descriptions (the README) in the metadata of every installed
  distribution, sorted by name, cut by the same rules: what projects say about themselves.
* ``jokes``: the English one-liners of the ``pyjokes`` package (its ``neutral`` and ``chuck``
  lists) and the aphorisms of the Zen of Python (the standard library's ``this``, decoded
  from its ROT13 text): short humorous prose and quotations, a register no other source has.
  A joke is one item (not cut into sentences); it must be ASCII and hold ``min_words ..
  max_words`` words.
* ``questions``: the 4,922 English questions people asked of a question-and-answer site that
  the ``mimesis`` package ships as data (``datasets/en/text.json``, key ``questions``):
  everyday English about money, travel, health, work ("What should i do to be a great
  geologist?"). Each is one item, kept by the rules of ``jokes``.
* ``news``: the Lee corpus that ``gensim`` ships among its test data
  (``test/test_data/lee_background.cor``): 300 Australian news stories, one per line,
  cut into sentences by the docstring rules. Reported prose of journalists.
* ``wikipedia``: the shortened dump of the English Wikipedia that ``gensim`` ships among its
  test data (``enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2``: 206
  pages, the early "A" articles, from Anarchism and Autism to Achilles and Abraham Lincoln).
  The wikitext of each page is reduced to its prose (:func:`wiki_paragraphs`: references,
  templates, tables, HTML and comments dropped, links replaced by their label, headings and
  list lines left out), then cut by the docstring rules: encyclopedic English on history,
  science, places and people.

Nothing is imported or run: source files are scanned or parsed with :mod:`ast`, metadata
is read with :mod:`importlib.metadata`, data files are located beside their package's
``__init__.py`` (:func:`importlib.util.find_spec`) and read as text or JSON. Each function
returns its pool deduplicated (case-insensitive, the first kept), in a fixed order: a pure
function of the installed files.
"""

from __future__ import annotations

import ast
import bz2
import codecs
import html
import importlib.metadata
import importlib.util
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from engine.configs import ConfigError

__all__ = [
    "code_comments",
    "description_texts",
    "joke_texts",
    "question_texts",
    "news_texts",
    "wikipedia_texts",
    "wiki_paragraphs",
    "JOKE_LISTS",
]

T = TypeVar("T")
_NOT_PROSE = ("!", "-*-", "type:", "noqa", "pragma", "fmt:")
JOKE_LISTS = ("neutral", "chuck")  # pyjokes' English lists (its "all" is their union)


def code_comments(files: Iterable[Path]) -> Iterator[str]:
    """The comment paragraphs of ``files``: runs of consecutive whole-line comments, joined
    (a comment after code on its line is left out; lines are scanned, not tokenized: a
    ``#`` line inside a string literal counts too, which the sentence rules then judge)."""
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        paragraph: list[str] = []
        for line in [*lines, ""]:
            stripped = line.strip()
            if stripped.startswith("#"):
                text = stripped.lstrip("#").strip()
                if text and not text.startswith(_NOT_PROSE):
                    paragraph.append(text)
                continue
            if paragraph:
                yield "\n".join(paragraph)
                paragraph = []


def description_texts() -> Iterator[str]:
    """The long description of every installed distribution, sorted by name (one each)."""
    seen: set[str] = set()
    dists = sorted(importlib.metadata.distributions(), key=lambda d: _name(d).lower())
    for dist in dists:
        name = _name(dist).lower()
        if not name or name in seen:
            continue
        seen.add(name)
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if isinstance(body, str) and body.strip():
            yield body


def _name(dist: importlib.metadata.Distribution) -> str:
    return str(dist.metadata.get("Name") or "")


def joke_texts(min_words: int, max_words: int) -> tuple[str, ...]:
    """pyjokes' English jokes, then the Zen of Python, each kept whole (module docstring)."""
    return _whole_items((*_pyjokes(), *_zen()), min_words, max_words)


def question_texts(min_words: int, max_words: int) -> tuple[str, ...]:
    """mimesis' English questions, each kept whole (module docstring)."""
    path = _package_dir("mimesis") / "datasets" / "en" / "text.json"
    questions = _read(path, lambda raw: json.loads(raw.decode("utf-8"))["questions"])
    texts = [q for q in questions if isinstance(q, str)]
    return _whole_items(texts, min_words, max_words)


def news_texts() -> Iterator[str]:
    """The stories of gensim's Lee corpus, one a line (module docstring)."""
    path = _package_dir("gensim") / "test" / "test_data" / "lee_background.cor"
    lines = _read(path, lambda raw: raw.decode("utf-8").splitlines())
    return (line for line in lines if line.strip())


WIKI_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
_WIKI_TEXT = re.compile(r"<text[^>]*>(.*?)</text>", re.S)
_WIKI_REF = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.S)
_WIKI_TAG = re.compile(r"<!--.*?-->|<[^>]+>", re.S)
_WIKI_INNER = re.compile(r"\{\{[^{}]*\}\}|\{\|[^{}]*?\|\}", re.S)  # innermost template or table
_WIKI_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")  # innermost [[target|label]]
_WIKI_URL = re.compile(r"\[(?:https?|ftp)://[^\s\]]*\s*([^\]]*)\]")  # [http://... label]
_NOT_PROSE_LINE = ("=", "*", "#", ":", ";", "|", "!", "{", "}")  # headings, lists, tables


def wikipedia_texts() -> Iterator[str]:
    """The prose paragraphs of every page of gensim's Wikipedia test dump, page by page."""
    path = _package_dir("gensim") / "test" / "test_data" / WIKI_DUMP
    dump = _read(path, lambda raw: bz2.decompress(raw).decode("utf-8"))
    for page in _WIKI_TEXT.finditer(dump):
        yield from wiki_paragraphs(page.group(1))


def wiki_paragraphs(wikitext: str) -> Iterator[str]:
    """The prose of one page's wikitext (as the dump escapes it), paragraph by paragraph."""
    text = _WIKI_TAG.sub("", _WIKI_REF.sub("", html.unescape(wikitext)))
    text = _innermost_first(_WIKI_INNER, "", text)  # nested templates, from the inside out
    text = _innermost_first(_WIKI_LINK, _link_label, text)
    text = _WIKI_URL.sub(r"\1", text).replace("'''", "").replace("''", "")
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [
            line
            for line in paragraph.splitlines()
            if line.strip() and not line.lstrip().startswith(_NOT_PROSE_LINE)
        ]
        if lines:
            yield " ".join(lines)


def _innermost_first(pattern: re.Pattern[str], repl: Any, text: str) -> str:
    while (new := pattern.sub(repl, text)) != text:
        text = new
    return text


def _link_label(match: re.Match[str]) -> str:
    """``[[target|label]]`` -> ``label`` (``[[target]]`` -> ``target``); a file, image or
    category link, or one into another namespace (``Wikipedia:``), -> nothing."""
    body = match.group(1)
    return "" if ":" in body.split("|")[0] else body.split("|")[-1]


def _whole_items(texts: Iterable[str], min_words: int, max_words: int) -> tuple[str, ...]:
    """``texts`` with their whitespace collapsed, each kept whole when it is ASCII and holds
    ``min_words .. max_words`` words, deduplicated case-insensitively (the first kept)."""
    out: list[str] = []
    seen: set[str] = set()
    for text in texts:
        text = " ".join(text.split())
        if (
            text.isascii()
            and min_words <= len(text.split()) <= max_words
            and text.lower() not in seen
        ):
            seen.add(text.lower())
            out.append(text)
    return tuple(out)


def _read(path: Path, parse: Callable[[bytes], T]) -> T:
    """``parse`` of a data file's bytes; a file that is missing, cut short or not what its
    reader expects is a ConfigError naming it (a broken install, not a crash)."""
    try:
        return parse(path.read_bytes())
    except (OSError, ValueError, KeyError, TypeError, EOFError) as err:
        raise ConfigError("data.params.source", f"cannot read {path} ({err})") from None


def _package_dir(name: str) -> Path:
    """The directory of the installed package ``name``, located, not imported."""
    spec = importlib.util.find_spec(name)
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    if not dirs or not Path(dirs[0]).is_dir():
        raise ConfigError("data.params.source", f"needs the package {name!r} (not installed)")
    return Path(dirs[0])


def _module_file(name: str, field: str) -> Path:
    spec = importlib.util.find_spec(name)  # located, not imported
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise ConfigError(field, f"needs the module {name!r} as a source file (not installed)")
    return Path(spec.origin)


def _pyjokes() -> list[str]:
    """The ``neutral`` and ``chuck`` lists of ``pyjokes/jokes_en.py``, read as literals."""
    tree = ast.parse(_module_file("pyjokes.jokes_en", "data.params.source").read_text("utf-8"))
    lists: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in JOKE_LISTS:
                value = ast.literal_eval(node.value)
                lists[target.id] = [v for v in value if isinstance(v, str)]
    return [joke for name in JOKE_LISTS for joke in lists.get(name, [])]


def _zen() -> list[str]:
    """The lines of the Zen of Python after its title (``this.s``, ROT13)."""
    tree = ast.parse(_module_file("this", "data.params.source").read_text("utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "s":
            text = codecs.decode(ast.literal_eval(node.value), "rot13")
            return [line for line in text.splitlines()[1:] if line.strip()]
    return []
