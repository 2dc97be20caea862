"""hf_bert data: stdlib_text sentences and text files, tokenized by the model's tokenizer.json."""

from __future__ import annotations

import sys

import pytest
import torch
from tokenizers import Tokenizer

from engine.data import DataConfig, build_data, stdlib_text, write_synthetic
from engine.data.stdlib_text import (
    StdlibTextParams,
    docstring_sentences,
    stdlib_sentences,
)
from engine.data.text_draw import generate_stdlib_text
from tests.helpers.hf_bert import MINILM, minilm_dir

MODEL = {"path": MINILM}


def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_padding()
    return tok


def test_docstring_sentences_keep_prose_and_drop_code():
    doc = """Return the frobnicated value.

    This function frobnicates its argument in a careful and well documented way.
    It never raises for valid input values of any kind.

        >>> frob(3)
        4

    Args:
        x -- the value to frobnicate
    Uses some_identifier_with_underscores internally in this sentence here.
    """
    import inspect

    got = docstring_sentences(inspect.cleandoc(doc), StdlibTextParams(min_words=4))
    assert got == [
        "Return the frobnicated value.",
        "This function frobnicates its argument in a careful and well documented way.",
        "It never raises for valid input values of any kind.",
    ]


def test_stdlib_text_is_deterministic_disjoint_and_bounded():
    params = StdlibTextParams()
    pool = stdlib_sentences(params)
    assert len(pool) > 3000 and len({s.lower() for s in pool}) == len(pool)
    a, info = generate_stdlib_text(600, 7, params)
    b, _ = generate_stdlib_text(600, 7, params)
    c, _ = generate_stdlib_text(600, 8, params)
    assert a == b and a != c and len(set(a)) == 600
    assert info["pool_size"] == len(pool) and len(info["pool_sha256"]) == 64
    for s in a:
        assert s[0].isupper() and s.endswith(".") and 6 <= len(s.split()) <= 40
    with pytest.raises(ValueError, match="data.n_train: with data.n_valid asks for"):
        generate_stdlib_text(len(pool) + 1, 0, params)


PACKAGE_INIT = '''"""A package that ships with nobody: its docstrings are what the test reads.

The first sentence here is long enough to be kept by the rules. Short one.
"""


def f():
    """Return the value that the caller asked for, unchanged and complete."""
    raise SystemExit("never imported, never run")
'''


def test_packages_add_the_docstrings_of_installed_packages_without_importing_them(
    tmp_path, monkeypatch
):
    pkg = tmp_path / "comera_docs_pkg"
    (pkg / "tests").mkdir(parents=True)
    (pkg / "__init__.py").write_text(PACKAGE_INIT)
    (pkg / "tests" / "test_it.py").write_text('"""Tests are never read by the generator here."""')
    (pkg / "sub").mkdir()
    (pkg / "sub" / "deep.py").write_text('"""Nested modules of the package are read as well."""')
    own = stdlib_sentences(StdlibTextParams())
    dup = own[0]  # a standard-library sentence repeated by the package is kept once
    (pkg / "dup.py").write_text(f'"""{dup}"""')
    monkeypatch.syspath_prepend(str(tmp_path))
    params = StdlibTextParams(packages=("comera_docs_pkg",))
    pool = stdlib_sentences(params)
    added = [
        "A package that ships with nobody: its docstrings are what the test reads.",
        "The first sentence here is long enough to be kept by the rules.",
        "Return the value that the caller asked for, unchanged and complete.",
        "Nested modules of the package are read as well.",
    ]
    assert pool == (*own, *added)  # the standard library's first, each sentence once
    assert "comera_docs_pkg" not in sys.modules  # parsed, not imported
    _, info = generate_stdlib_text(10, 0, params)
    assert info["pool_size"] == len(own) + 4 and info["packages"] == {"comera_docs_pkg": None}
    with pytest.raises(ValueError, match="with the packages \\['comera_docs_pkg'\\]"):
        generate_stdlib_text(len(pool) + 1, 0, params)


@pytest.mark.parametrize(
    ("packages", "message"),
    [
        (("no_such_package_here",), "is not an installed package"),
        (("a-b",), "distinct package names"),
        (("x",) * 2, "distinct package names"),
        (tuple(f"p{i}" for i in range(17)), "at most 16"),
    ],
)
def test_packages_that_are_not_installed_or_not_names_are_refused(packages, message):
    with pytest.raises(ValueError, match=f"data.params.packages: .*{message}"):
        stdlib_sentences(StdlibTextParams(packages=packages))
    with pytest.raises(ValueError, match="data.params.packages: adds source files"):
        StdlibTextParams(source="reference", packages=("numpy",))


def test_packages_with_too_many_files_are_refused(tmp_path, monkeypatch):
    pkg = tmp_path / "comera_many_files"
    pkg.mkdir()
    for i in range(3):
        (pkg / f"m{i}.py").write_text('"""A module of the package with a docstring in it."""')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(stdlib_text, "MAX_PACKAGE_FILES", 2)
    with pytest.raises(
        ValueError, match="3 source files in \\['comera_many_files'\\], more than 2"
    ):
        stdlib_sentences(StdlibTextParams(packages=("comera_many_files",)))


def test_synthetic_stdlib_text_batches_encode_like_the_tokenizer():
    cfg = DataConfig(
        kind="synthetic",
        generator="stdlib_text",
        n_train=50,
        n_valid=20,
        max_len=16,
        synthetic_seed=3,
    )
    bundle = build_data(cfg, arch="hf_bert", batch_size=8, seed=0, model_config=MODEL)
    assert bundle.train.num_examples() == 50 and bundle.valid.num_examples() == 20
    sentences, _ = generate_stdlib_text(70, 3, StdlibTextParams())
    valid = list(bundle.valid.batches(0))
    assert [b["input_ids"].shape[0] for b in valid] == [8, 8, 4]
    tok = tokenizer()
    tok.enable_truncation(16)
    first = valid[0]
    for i, text in enumerate(sentences[50:58]):  # validation keeps the generated order
        ids = tok.encode(text).ids
        n = int(first["attention_mask"][i].sum())
        assert first["input_ids"][i, :n].tolist() == ids and ids[0] == 101 and ids[-1] == 102
        assert not first["input_ids"][i, n:].any()
    assert first["attention_mask"].dtype == torch.bool
    assert first["token_type_ids"].shape == first["input_ids"].shape
    assert not first["token_type_ids"].any()
    train_texts = set(sentences[:50])
    assert not train_texts & set(sentences[50:])  # held out


def test_text_files_feed_hf_bert_and_blank_lines_are_skipped(tmp_path):
    files = write_synthetic("stdlib_text", tmp_path, n_train=30, n_valid=10, seed=1)
    assert files.kind == "text"
    lines = (tmp_path / "train.txt").read_text().splitlines()
    (tmp_path / "train.txt").write_text("\n".join([lines[0], "", *lines[1:], "   "]) + "\n")
    cfg = files.config(max_len=32, shuffle_buffer=0)
    bundle = build_data(cfg, arch="hf_bert", batch_size=7, seed=0, model_config=MODEL)
    rows = sum(b["input_ids"].shape[0] for b in bundle.train.batches(0))
    assert rows == 30 and bundle.train.num_examples() == 30
    assert sum(b["input_ids"].shape[0] for b in bundle.valid.batches(0)) == 10
    split = build_data(
        DataConfig(kind="text", train=files.train, valid_every=5),
        arch="hf_bert",
        batch_size=4,
        seed=0,
        model_config=MODEL,
    )
    assert sum(b["input_ids"].shape[0] for b in split.valid.batches(0)) == 6


def test_hf_bert_data_needs_a_tokenizer_and_a_text_kind(tmp_path):
    cfg = DataConfig(kind="synthetic", generator="stdlib_text", n_train=10, n_valid=0)
    with pytest.raises(ValueError, match="data.tokenizer: .*model.config.path"):
        build_data(cfg, arch="hf_bert", batch_size=4, seed=0)
    with pytest.raises(ValueError, match="model.config.path: .*is not a directory"):
        build_data(
            cfg,
            arch="hf_bert",
            batch_size=4,
            seed=0,
            model_config={"path": str(tmp_path / "nowhere")},
        )
    given = DataConfig(
        kind="synthetic",
        generator="stdlib_text",
        n_train=10,
        n_valid=0,
        tokenizer=str(minilm_dir() / "tokenizer.json"),
    )
    assert build_data(given, arch="hf_bert", batch_size=4, seed=0).train.num_examples() == 10
    with pytest.raises(ValueError, match="data.generator: 'mlm' makes data for model.arch 'mlm'"):
        build_data(
            cfg.replace(generator="mlm"), arch="hf_bert", batch_size=4, seed=0, model_config=MODEL
        )
    (tmp_path / "t.jsonl").write_text('{"premise": "a", "hypothesis": "b", "label": 0}\n')
    with pytest.raises(ValueError, match="data.kind: 'jsonl' feeds model.arch 'transformer'"):
        build_data(
            DataConfig(kind="jsonl", train=str(tmp_path / "t.jsonl")),
            arch="hf_bert",
            batch_size=4,
            seed=0,
            model_config=MODEL,
        )


def test_stdlib_text_length_buckets_pad_less_and_keep_every_sentence():
    common = {
        "kind": "synthetic",
        "generator": "stdlib_text",
        "n_train": 96,
        "n_valid": 8,
        "max_len": 64,
        "synthetic_seed": 1,
    }
    plain, bucketed = (
        build_data(
            DataConfig(**common, length_buckets=k),
            arch="hf_bert",
            batch_size=8,
            seed=0,
            model_config=MODEL,
        )
        for k in (0, 6)
    )
    tok = tokenizer()
    tok.enable_truncation(64)

    def rows(bundle):  # (sentence ids, padded positions) of epoch 0
        seen, padded = [], 0
        for b in bundle.train.batches(0):
            mask = b["attention_mask"]
            padded += int((~mask).sum())
            seen += [tuple(b["input_ids"][i, : int(m.sum())].tolist()) for i, m in enumerate(mask)]
        return seen, padded

    (a, pad_a), (b, pad_b) = rows(plain), rows(bucketed)
    assert sorted(a) == sorted(b) and len(b) == 96  # the same sentences, each once
    assert pad_b < 0.5 * pad_a
    sentences, _ = generate_stdlib_text(104, 1, StdlibTextParams())
    assert {tuple(tok.encode(t).ids) for t in sentences[:96]} == set(b)
