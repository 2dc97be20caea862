"""JSONL / CSV sentence(-pair) loader against plain-Python parsing + the tokenizers library."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from engine.data import DataConfig, DataError, build_data

ROWS = [
    ("The cat sat on the mat.", "A cat is sitting.", "entailment"),
    ("Dogs bark, loudly!", "Nothing barks.", "contradiction"),
    ("A very long premise " + "with many many words " * 12, "short", "neutral"),
    ("x", "A hypothesis that is " + "rather long " * 20, "neutral"),
    ('Quotes "inside", and\ta tab', "Line\nbreak inside", "entailment"),
    ("", "empty premise", "contradiction"),
    ("Ünïcödé wörds", "Ascii words", "neutral"),
]


def _write_jsonl(path: Path, rows, label_key="label") -> Path:
    path.write_text(
        "".join(
            json.dumps({"premise": a, "hypothesis": b, label_key: y}) + "\n" for a, b, y in rows
        )
    )
    return path


def _write_csv(path: Path, rows) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "hypothesis", "label", "premise"])
        w.writerows([i, b, y, a] for i, (a, b, y) in enumerate(rows))
    return path


def _reference(tok: Tokenizer, a: str, b: str | None, max_len: int) -> tuple[list, list]:
    """[CLS] a [SEP] b [SEP] with longest-first truncation, from raw tokenizer pieces."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    ta = tok.encode(a, add_special_tokens=False).ids
    if b is None:
        ta = ta[: max_len - 2]
        return [cls, *ta, sep], [0] * (len(ta) + 2)
    tb = tok.encode(b, add_special_tokens=False).ids
    while len(ta) + len(tb) > max_len - 3:  # drop from the longer, the second on a tie
        if len(ta) > len(tb):
            ta = ta[:-1]
        else:
            tb = tb[:-1]
    return [cls, *ta, sep, *tb, sep], [0] * (len(ta) + 2) + [1] * (len(tb) + 1)


def _unpad(batches):
    out = []
    for b in batches:
        for ids, types, mask, y in zip(
            b["input_ids"], b["token_type_ids"], b["attention_mask"], b["labels"], strict=True
        ):
            n = int(mask.sum())
            assert mask[:n].all() and not mask[n:].any()
            out.append(
                (ids[:n].tolist(), types[:n].tolist(), int(y), ids[n:].tolist(), types[n:].tolist())
            )
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_batches_match_reference_encoding(tmp_path, fmt):
    path = (_write_jsonl if fmt == "jsonl" else _write_csv)(tmp_path / f"d.{fmt}", ROWS)
    cfg = DataConfig(kind=fmt, train=str(path), max_len=24, shuffle_buffer=0, vocab_size=200)
    bundle = build_data(cfg, arch="transformer", batch_size=3, seed=0, workdir=tmp_path / "w")
    tok = Tokenizer.from_file(bundle.artifacts["tokenizer"])
    labels = bundle.info["labels"]
    assert labels == sorted({y for _, _, y in ROWS})
    assert json.loads(Path(bundle.artifacts["labels"]).read_text())["labels"] == labels
    assert bundle.model_overrides == {
        "vocab_size": tok.get_vocab_size(),
        "num_classes": 3,
        "max_len": 24,
    }
    # plain-Python parse of the file
    if fmt == "jsonl":
        ref_rows = [json.loads(x) for x in path.read_text().splitlines()]
    else:
        ref_rows = list(csv.DictReader(open(path, newline="")))
    got = _unpad(bundle.train.batches(0))
    assert len(got) == len(ROWS) and bundle.train.num_examples() == len(ROWS)
    pad = tok.token_to_id("[PAD]")
    for r, (ids, types, y, pad_ids, pad_types) in zip(ref_rows, got, strict=True):
        assert (ids, types) == _reference(tok, r["premise"], r["hypothesis"], 24)
        assert y == labels.index(r["label"])
        assert set(pad_ids) <= {pad} and set(pad_types) <= {0}
    assert max(len(g[0]) for g in got) == 24  # truncation reached max_len


def test_single_sentence_static_padding_and_given_labels(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    labels = ["neutral", "entailment", "contradiction"]
    cfg = DataConfig(
        kind="jsonl",
        train=str(path),
        text_b=None,
        labels=labels,
        max_len=16,
        pad_to_max_len=True,
        shuffle_buffer=0,
        vocab_size=200,
    )
    bundle = build_data(cfg, arch="transformer", batch_size=4, seed=0, workdir=tmp_path / "w")
    tok = Tokenizer.from_file(bundle.artifacts["tokenizer"])
    assert "labels" not in bundle.artifacts
    batches = list(bundle.train.batches(0))
    assert all(b["input_ids"].shape[1] == 16 for b in batches)
    for (a, _, y), (ids, types, yi, _, _) in zip(ROWS, _unpad(batches), strict=True):
        assert (ids, types) == _reference(tok, a, None, 16) and yi == labels.index(y)


def test_integer_labels_sort_numerically_and_tokenizer_is_reused(tmp_path):
    rows = [(f"a {i}", f"b {i}", y) for i, y in enumerate([10, 2, 0, 2, 10, 1])]
    path = tmp_path / "d.jsonl"
    _write_jsonl(path, rows)
    cfg = DataConfig(kind="jsonl", train=str(path), vocab_size=100)
    first = build_data(cfg, arch="transformer", batch_size=2, seed=0, workdir=tmp_path / "w")
    assert first.info["labels"] == ["0", "1", "2", "10"] and first.info["tokenizer"] == "trained"
    tok_text = Path(first.artifacts["tokenizer"]).read_text()
    again = build_data(cfg, arch="transformer", batch_size=2, seed=0, workdir=tmp_path / "w")
    assert again.info["tokenizer"] == "reused" and again.info["labels"] == first.info["labels"]
    assert Path(again.artifacts["tokenizer"]).read_text() == tok_text
    for x, y in zip(first.train.batches(1), again.train.batches(1), strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)
    given = build_data(
        cfg.replace(tokenizer=first.artifacts["tokenizer"], labels=[0, 1, 2, 10]),
        arch="transformer",
        batch_size=2,
        seed=0,
    )
    assert given.info["tokenizer"] == "loaded" and given.train.num_examples() is None
    assert [int(v) for b in given.train.batches(0) for v in b["labels"]] != []


def test_valid_file_and_valid_every_split(tmp_path):
    rows = [(f"w{i} x", f"w{i}", ["p", "q"][i % 2]) for i in range(11)]
    train = _write_jsonl(tmp_path / "t.jsonl", rows)
    valid = _write_jsonl(tmp_path / "v.jsonl", rows[:3])
    cfg = DataConfig(kind="jsonl", train=str(train), valid=str(valid), vocab_size=100)
    b = build_data(cfg, arch="transformer", batch_size=2, seed=0)
    assert [int(v) for x in b.valid.batches(0) for v in x["labels"]] == [0, 1, 0]
    cfg = DataConfig(
        kind="jsonl", train=str(train), valid_every=4, vocab_size=100, shuffle_buffer=0
    )
    w = tmp_path / "w"
    b = build_data(cfg, arch="transformer", batch_size=2, seed=0, workdir=w)
    assert (b.train.num_examples(), b.valid.num_examples()) == (9, 2)  # known from the scan
    whole = _unpad(
        build_data(
            cfg.replace(valid_every=0), arch="transformer", batch_size=2, seed=0, workdir=w
        ).train.batches(0)
    )
    assert _unpad(b.valid.batches(0)) == [whole[3], whole[7]]
    assert _unpad(b.train.batches(0)) == [r for i, r in enumerate(whole) if i % 4 != 3]


MALFORMED_JSONL = [
    (
        '{"premise": "a", "hypothesis": "b", "label": "x"}\n{"premise": "a", "label": "x"}\n',
        2,
        "expected key 'hypothesis'",
    ),
    (
        '{"premise": "a", "hypothesis": "b", "label": "x"}\n{"premise": "a", "hyp\n',
        2,
        "expected a JSON object",
    ),
    ("[1, 2]\n", 1, "got list"),
    ('{"premise": 3, "hypothesis": "b", "label": "x"}\n', 1, "expected a string in 'premise'"),
    ('{"premise": "a", "hypothesis": "b", "label": 1.5}\n', 1, "label"),
    ('{"premise": "a", "hypothesis": "b", "label": true}\n', 1, "label"),
    ('{"premise": "a", "hypothesis": "b", "label": "x"}\n\n', 2, "empty line"),
]


MALFORMED_CSV = [
    ('premise,hypothesis,label\n"multi\nline",b,x\na,b\n', 4, "expected 3 comma-separated"),
    ("premise,hypothesis,label\na,b,x,extra\n", 2, "expected 3 comma-separated"),
    ("premise,hypothesis,label\na,b,\n", 2, "non-empty string or integer label"),
    ("premise,label\na,x\n", 1, "column 'hypothesis'"),
    ('premise,hypothesis,label\na,"b"x,y\n', 2, "well-formed CSV"),
    ("premise,hypothesis,label\n\n", 2, "expected 3 comma-separated"),
]


MALFORMED = [("jsonl", *case) for case in MALFORMED_JSONL] + [
    ("csv", *case) for case in MALFORMED_CSV
]


@pytest.mark.parametrize("kind,text,line,match", MALFORMED)
def test_malformed_file_names_file_and_line(tmp_path, kind, text, line, match):
    path = tmp_path / f"bad.{kind}"
    path.write_text(text)
    with pytest.raises(DataError, match=match) as err:
        build_data(
            DataConfig(kind=kind, train=str(path), vocab_size=100),
            arch="transformer",
            batch_size=2,
            seed=0,
        )
    assert (err.value.path, err.value.line) == (str(path), line)
    assert str(err.value).startswith(f"{path}:{line}: ")


def test_errors_found_while_iterating_and_unknown_label(tmp_path):
    good = _write_jsonl(tmp_path / "t.jsonl", ROWS)
    tok = build_data(
        DataConfig(kind="jsonl", train=str(good), vocab_size=100),
        arch="transformer",
        batch_size=2,
        seed=0,
        workdir=tmp_path / "w",
    ).artifacts["tokenizer"]
    bad = tmp_path / "b.jsonl"
    bad.write_text(good.read_text() + "not json\n")
    cfg = DataConfig(
        kind="jsonl",
        train=str(bad),
        tokenizer=tok,
        labels=["entailment", "neutral", "contradiction"],
        shuffle_buffer=3,
    )
    b = build_data(cfg, arch="transformer", batch_size=2, seed=0)  # no pass at build time
    with pytest.raises(DataError) as err:
        list(b.train.batches(0))
    assert (err.value.path, err.value.line) == (str(bad), len(ROWS) + 1)
    with pytest.raises(DataError, match="expected a label in") as err:
        list(
            build_data(
                cfg.replace(train=str(good), labels=["entailment", "neutral"]),
                arch="transformer",
                batch_size=2,
                seed=0,
            ).train.batches(0)
        )
    assert err.value.line == 2  # the first contradiction row
    utf = tmp_path / "u.jsonl"
    utf.write_bytes(good.read_bytes() + b'{"premise": "\xff"}\n')
    with pytest.raises(DataError, match="UTF-8") as err:
        list(
            build_data(
                cfg.replace(train=str(utf)), arch="transformer", batch_size=2, seed=0
            ).train.batches(0)
        )
    assert err.value.line == len(ROWS) + 1
