"""The English sources beyond docstrings: code comments, package descriptions, jokes, and a
mix of sources, against the packages' own APIs and hand-made packages."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import io
import sys

import numpy as np
import pytest

from engine.data.english_text import WIKI_DUMP, wiki_paragraphs
from engine.data.stdlib_text import (
    StdlibTextParams,
    stdlib_sentences,
)
from engine.data.text_draw import generate_stdlib_text, generate_tagged_text

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


def test_weights_draw_each_source_in_proportion_and_keep_train_and_validation_disjoint():
    mix: dict = {"also": ("jokes",), "min_words": 3, "modules": ("email",)}
    plain = StdlibTextParams(**mix)
    pool = stdlib_sentences(plain)
    n_docs = len(pool) - len(stdlib_sentences(StdlibTextParams(source="jokes", min_words=3)))
    n = len(pool) // 4
    _, drawn, info = generate_tagged_text(n, 0, plain)
    assert "weights" not in info or info["weights"] == {}
    # weight w: the odds of a joke against a docstring at each draw are w : 1; the first
    # quarter's share of jokes against the brute-force expectation of sequential draws
    for w in (1.0, 4.0):
        expect = _expected_drawn(n_docs, len(pool) - n_docs, w, n)
        shares = []
        for seed in range(10):
            lines, tags, info = generate_tagged_text(
                n, seed, StdlibTextParams(**mix, weights={"jokes": w})
            )
            assert len(set(lines)) == n and set(lines) <= set(pool)  # without replacement
            shares.append(tags.count("jokes"))
        assert info["weights"] == {"jokes": w} and info["drawn_per_source"]["jokes"] == shares[-1]
        assert abs(np.mean(shares) - expect) < 0.1 * expect + 3, (w, np.mean(shares), expect)
    # any prefix of one draw is the draw of fewer: train, then validation, disjoint
    weighted = StdlibTextParams(**mix, weights={"jokes": 4})
    short, _, _ = generate_tagged_text(n // 2, 3, weighted)
    long, _, _ = generate_tagged_text(n, 3, weighted)
    assert long[: n // 2] == short
    with pytest.raises(ValueError, match="data.params.weights: must map sources of the mix"):
        StdlibTextParams(also=("jokes",), weights={"news": 2})  # not in the mix
    with pytest.raises(ValueError, match="data.params.weights"):
        StdlibTextParams(weights={"docstrings": 2})  # no mix


def _expected_drawn(a: int, b: int, w: float, n: int) -> float:
    """Expected count of the ``b`` items of weight ``w`` among ``n`` drawn one by one without
    replacement from ``a`` items of weight 1 and them (each draw in proportion to weight)."""
    dist = np.zeros(n + 1)
    dist[0] = 1.0  # dist[k]: probability that k of the b were drawn so far
    for step in range(n):
        k = np.arange(step + 1)
        left_b = b - k
        left_a = a - (step - k)
        p_b = np.where(left_b > 0, w * left_b / (w * left_b + np.maximum(left_a, 0)), 0.0)
        new = np.zeros(n + 1)
        new[: step + 1] += dist[: step + 1] * (1 - p_b)
        new[1 : step + 2] += dist[: step + 1] * p_b
        dist = new
    return float((np.arange(n + 1) * dist).sum())


WIKITEXT = "\n".join(
    [
        "{{Infobox person|name=Ada {{nowrap|Lovelace}}|born=1815}}",
        "'''Ada Lovelace''' was an English [[mathematician]] and [[Writer|writer]].<ref "
        'name="a">Toole, 1998.</ref> She worked on the [[Analytical Engine|engine]] of '
        "[[Charles Babbage]].<ref>Fuegi.</ref>",
        "[[File:Ada.jpg|thumb|A portrait of [[Ada Lovelace|Ada]].]]",
        "== Life ==",
        "<!-- a comment -->Her notes held an [http://example.org algorithm] for the machine.",
        "* a list line",
        '{| class="wikitable"',
        "| a table cell",
        "|}",
        "",
        "She died in 1852 &amp; was buried in [[Category:People]]Hucknall.",
    ]
)


def test_wikipedia_pages_are_reduced_to_their_prose():
    assert list(wiki_paragraphs(WIKITEXT)) == [  # the file link's line, emptied, parts them
        "Ada Lovelace was an English mathematician and writer. She worked on the engine of "
        "Charles Babbage.",
        "Her notes held an algorithm for the machine.",
        "She died in 1852 & was buried in Hucknall.",
    ]


def test_wikipedia_sentences_are_the_words_gensims_own_filter_keeps():
    """The dump's prose by gensim's own markup filter (``filter_wiki``) as the reference: the
    sentences of the source are word for word in it."""
    import bz2
    import re

    from gensim.corpora.wikicorpus import filter_wiki
    from gensim.test.utils import datapath

    pool = stdlib_sentences(StdlibTextParams(source="wikipedia", min_words=3))
    assert len(pool) > 12_000 and len({s.lower() for s in pool}) == len(pool)
    dump = bz2.decompress(open(datapath(WIKI_DUMP), "rb").read()).decode("utf-8")
    pages = re.findall(r"<text[^>]*>(.*?)</text>", dump, re.S)
    assert len(pages) == 206

    def words(text: str) -> str:
        return " " + " ".join(re.findall(r"[a-z0-9]+", text.lower())) + " "

    reference = "".join(words(filter_wiki(page)) for page in pages)
    sample = pool[:: max(1, len(pool) // 2000)]
    found = sum(words(s) in reference for s in sample)
    assert found >= 0.99 * len(sample), (found, len(sample))


def test_a_broken_data_file_is_a_config_error_naming_it(monkeypatch, tmp_path):
    """A package's data file that is missing, not JSON or a cut-off bz2 stream: each reader
    says which file and that it cannot read it (a broken install, not a traceback)."""
    from engine.configs import ConfigError
    from engine.data import english_text

    monkeypatch.setattr(english_text, "_package_dir", lambda name: tmp_path / name)
    (tmp_path / "mimesis" / "datasets" / "en").mkdir(parents=True)
    (tmp_path / "mimesis" / "datasets" / "en" / "text.json").write_text('{"answers": []}')
    data = tmp_path / "gensim" / "test" / "test_data"
    data.mkdir(parents=True)
    (data / WIKI_DUMP).write_bytes(b"BZh91AY&SY")  # a bz2 header and nothing after it
    readers = [
        (lambda: english_text.question_texts(3, 40), "text.json"),  # no "questions" key
        (lambda: list(english_text.news_texts()), "lee_background.cor"),  # missing
        (lambda: list(english_text.wikipedia_texts()), WIKI_DUMP),  # cut short
    ]
    for read, name in readers:
        with pytest.raises(ConfigError, match=rf"cannot read .*{name}"):
            read()
