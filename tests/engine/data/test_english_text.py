"""The English sources beyond docstrings: code comments, package descriptions, jokes, and a
mix of sources, against the packages' own APIs and hand-made packages."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import io
import sys

import pytest

from engine.data.stdlib_text import StdlibTextParams, generate_stdlib_text, stdlib_sentences

COMMENTED = """#!/usr/bin/env python
# -*- coding: utf-8 -*-
import os  # a comment after code is not a paragraph of its own

# The first paragraph of comments is two lines long and it
# continues here until the code below ends it.
x = 1
# noqa: E501
# A second paragraph stands alone and is long enough to keep.

# Short one.
raise SystemExit("never imported, never run")
"""


def test_comments_are_paragraphs_of_whole_line_comments_read_not_imported(tmp_path, monkeypatch):
    pkg = tmp_path / "comera_commented_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(COMMENTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    own = stdlib_sentences(StdlibTextParams(source="comments"))
    assert len(own) > 1000 and len({s.lower() for s in own}) == len(own)
    pool = stdlib_sentences(StdlibTextParams(source="comments", packages=("comera_commented_pkg",)))
    assert pool == (
        *own,
        "The first paragraph of comments is two lines long and it continues here until the "
        "code below ends it.",
        "A second paragraph stands alone and is long enough to keep.",
    )
    assert "comera_commented_pkg" not in sys.modules
    email = stdlib_sentences(StdlibTextParams(source="comments", modules=("email",)))
    assert 0 < len(email) < len(own) and set(email) <= set(own)


def test_jokes_are_pyjokes_english_lists_and_the_zen_of_python():
    import pyjokes

    pool = stdlib_sentences(StdlibTextParams(source="jokes", min_words=3))
    jokes = [
        j
        for category in ("neutral", "chuck")
        for j in pyjokes.get_jokes(language="en", category=category)
    ]
    with contextlib.redirect_stdout(io.StringIO()) as printed:  # `this` prints on import
        sys.modules.pop("this", None)
        this = importlib.import_module("this")
    zen = "".join(this.d.get(c, c) for c in this.s).splitlines()[1:]
    assert printed.getvalue().splitlines()[1:] == zen  # the module's own decoding
    want, seen = [], set()
    for text in (*jokes, *zen):
        text = " ".join(text.split())
        if text.isascii() and 3 <= len(text.split()) <= 40 and text.lower() not in seen:
            seen.add(text.lower())
            want.append(text)
    assert pool == tuple(want) and len(pool) > 250
    assert "Beautiful is better than ugly." in pool and "Simple is better than complex." in pool
    six = stdlib_sentences(StdlibTextParams(source="jokes"))  # min_words 6 by default
    assert set(six) < set(pool) and all(len(t.split()) >= 6 for t in six)


def test_descriptions_are_sentences_of_the_installed_distributions_readmes():
    pool = stdlib_sentences(StdlibTextParams(source="descriptions"))
    assert len(pool) > 100
    texts = [
        " ".join(str(d.metadata.get_payload() or d.metadata.get("Description") or "").split())
        for d in importlib.metadata.distributions()
    ]
    for sentence in pool[:: max(1, len(pool) // 50)]:  # every one is some README's text
        assert any(sentence in t for t in texts), sentence


def test_also_appends_more_sources_and_is_validated():
    docs = stdlib_sentences(StdlibTextParams())
    comments = stdlib_sentences(StdlibTextParams(source="comments"))
    mixed = StdlibTextParams(also=("comments", "jokes"))
    pool = stdlib_sentences(mixed)
    jokes = stdlib_sentences(StdlibTextParams(source="jokes"))
    seen = {s.lower() for s in docs}
    new_comments = [s for s in comments if s.lower() not in seen]
    seen |= {s.lower() for s in new_comments}
    assert pool == (*docs, *new_comments, *(j for j in jokes if j.lower() not in seen))
    _, info = generate_stdlib_text(10, 0, mixed)
    assert info["source"] == "docstrings" and info["also"] == ["comments", "jokes"]
    with pytest.raises(ValueError, match="data.params.also: must list distinct sources"):
        StdlibTextParams(also=("docstrings",))
    with pytest.raises(ValueError, match="data.params.also: must list distinct sources"):
        StdlibTextParams(also=("poems",))
    with pytest.raises(ValueError, match="data.params.modules: selects source files"):
        StdlibTextParams(source="jokes", also=("reference",), modules=("email",))
    StdlibTextParams(source="jokes", also=("comments",), modules=("email",))  # comments: files


def test_questions_are_mimesis_english_questions_read_not_imported(monkeypatch):
    from mimesis import Locale, Text

    monkeypatch.delitem(sys.modules, "mimesis")  # put back after the test
    pool = stdlib_sentences(StdlibTextParams(source="questions", min_words=3))
    assert "mimesis" not in sys.modules  # its data file was read, the package never imported
    questions = Text(locale=Locale.EN)._extract(["questions"])  # mimesis' own loader
    want, seen = [], set()
    for text in questions:
        text = " ".join(text.split())
        if text.isascii() and 3 <= len(text.split()) <= 40 and text.lower() not in seen:
            seen.add(text.lower())
            want.append(text)
    assert pool == tuple(want) and len(pool) > 4000
    assert sum(q.endswith("?") for q in pool) > 0.9 * len(pool)


def test_news_are_sentences_of_gensims_lee_corpus():
    from gensim.test.utils import datapath

    pool = stdlib_sentences(StdlibTextParams(source="news"))
    with open(datapath("lee_background.cor"), encoding="utf-8") as f:
        stories = [" ".join(line.split()) for line in f if line.strip()]
    assert len(stories) == 300 and len(pool) > 1500
    for sentence in pool[:: max(1, len(pool) // 60)]:  # each is some story's text, one sentence
        assert any(sentence in story for story in stories), sentence
        assert sentence[0].isupper() and sentence.endswith(".")
    assert pool[0] == stories[0].split(". ")[0] + "."
