"""Masked-LM text loader: packing against a plain-Python reference, BERT masking statistics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from engine.data import DataConfig, DataError, build_data
from engine.data.lines import IGNORE_INDEX
from engine.data.synthetic import write_synthetic

TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "a second line of the first document",
    "",
    "new document " + "with a very long line " * 8,
    "short",
    "   ",
    "after blank lines, punctuation!",
    "tail",
]


def _reference(tok: Tokenizer, lines: list[str], max_len: int, pack: bool) -> list[list[int]]:
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    cap, out, docs, cur = max_len - 2, [], [], []
    for line in lines:  # split into documents of tokenized lines
        if line.strip():
            cur.append(tok.encode(line, add_special_tokens=False).ids)
        elif cur:
            docs.append(cur)
            cur = []
    docs += [cur] if cur else []
    for doc in docs:
        if not pack:
            out += [[cls, *ids[:cap], sep] for ids in doc]
            continue
        seq: list[int] = []
        for ids in doc:
            chunks = [ids[i : i + cap] for i in range(0, len(ids), cap)]
            for chunk in chunks:
                if seq and len(seq) + 1 + len(chunk) <= cap and len(chunks) == 1:
                    seq += [sep, *chunk]
                else:
                    if seq:
                        out.append([cls, *seq, sep])
                    seq = list(chunk)
                    if len(chunks) > 1 and len(chunk) == cap:
                        out.append([cls, *seq, sep])
                        seq = []
        if seq:
            out.append([cls, *seq, sep])
    return out


def _unmasked(batches) -> list[list[int]]:
    out = []
    for b in batches:
        ids = torch.where(b["labels"] != IGNORE_INDEX, b["labels"], b["input_ids"])
        for row, mask in zip(ids, b["attention_mask"], strict=True):
            out.append(row[: int(mask.sum())].tolist())
    return out


def _build(path: Path, tmp_path: Path, **kw):
    cfg = DataConfig(kind="text", train=str(path), vocab_size=120, shuffle_buffer=0, **kw)
    return build_data(cfg, arch="mlm", batch_size=3, seed=0, workdir=tmp_path / "w")


@pytest.mark.parametrize("pack", [True, False])
def test_sequences_match_reference_packing(tmp_path, pack):
    path = tmp_path / "t.txt"
    path.write_text("\n".join(TEXT) + "\n")
    b = _build(path, tmp_path, max_len=12, mlm_pack=pack)
    tok = Tokenizer.from_file(b.artifacts["tokenizer"])
    assert b.model_overrides == {"vocab_size": tok.get_vocab_size(), "max_len": 12}
    ref = _reference(tok, TEXT, 12, pack)
    assert _unmasked(b.train.batches(0)) == ref
    assert max(len(s) for s in ref) == 12
    batch = next(b.train.batches(0))
    pad = tok.token_to_id("[PAD]")
    assert (batch["input_ids"][~batch["attention_mask"]] == pad).all()
    assert (batch["labels"][~batch["attention_mask"]] == IGNORE_INDEX).all()


def test_masking_follows_bert_80_10_10(tmp_path):
    files = write_synthetic("mlm", tmp_path, n_train=3000, seed=0)
    cfg = files.config(max_len=64, vocab_size=400)
    b = build_data(cfg, arch="mlm", batch_size=64, seed=0, workdir=tmp_path / "w")
    tok = Tokenizer.from_file(b.artifacts["tokenizer"])
    special = torch.tensor(
        [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    )
    counts = torch.zeros(4)  # eligible, chosen, [MASK], kept
    for batch in b.train.batches(0):
        orig = torch.where(batch["labels"] != IGNORE_INDEX, batch["labels"], batch["input_ids"])
        chosen = batch["labels"] != IGNORE_INDEX
        eligible = batch["attention_mask"] & ~torch.isin(orig, special)
        assert not (chosen & ~eligible).any()  # never a special token or padding
        assert chosen.any(1).all()  # every sequence contributes
        replaced = batch["input_ids"][chosen]
        assert not torch.isin(replaced, special[special != tok.token_to_id("[MASK]")]).any()
        counts += torch.tensor(
            [
                eligible.sum(),
                chosen.sum(),
                (replaced == tok.token_to_id("[MASK]")).sum(),
                (replaced == batch["labels"][chosen]).sum(),
            ]
        )
    eligible, chosen, masked, kept = counts.tolist()
    assert abs(chosen / eligible - 0.15) < 0.01
    assert abs(masked / chosen - 0.8) < 0.02
    assert abs(kept / chosen - 0.1) < 0.02  # (random replacements rarely hit the original)
    assert abs(1 - (masked + kept) / chosen - 0.1) < 0.02


def test_masks_replay_per_epoch_and_validation_masks_are_fixed(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("\n".join(TEXT * 20) + "\n")
    cfg = DataConfig(
        kind="text", train=str(path), vocab_size=120, max_len=16, valid_every=3, shuffle_buffer=4
    )
    b = build_data(cfg, arch="mlm", batch_size=4, seed=1, workdir=tmp_path)

    def eq(xs, ys):
        xs, ys = list(xs), list(ys)
        return len(xs) == len(ys) and all(
            torch.equal(x[k], y[k]) for x, y in zip(xs, ys, strict=True) for k in x
        )

    assert eq(b.train.batches(2), b.train.batches(2))
    assert eq(list(b.train.batches(2))[3:], b.train.batches(2, start=3))
    assert not eq(b.train.batches(2), b.train.batches(3))
    assert eq(b.valid.batches(0), b.valid.batches(7))
    seqs = _unmasked(b.train.batches(0)) + _unmasked(b.valid.batches(0))
    whole = _unmasked(
        build_data(
            cfg.replace(valid_every=0, shuffle_buffer=0),
            arch="mlm",
            batch_size=4,
            seed=1,
            workdir=tmp_path,
        ).train.batches(0)
    )
    assert sorted(seqs) == sorted(whole)


def test_malformed_text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"fine line\nstill fine\n\xc3\x28 broken\n")
    with pytest.raises(DataError, match="UTF-8") as err:
        _build(path, tmp_path)
    assert (err.value.path, err.value.line) == (str(path), 3)
    path.write_text("fine line\n\x01\x02\n")  # control characters only: no token
    (tmp_path / "ok.txt").write_text("fine line\n")
    tok = _build(tmp_path / "ok.txt", tmp_path).artifacts["tokenizer"]
    b = build_data(
        DataConfig(kind="text", train=str(path), tokenizer=tok), arch="mlm", batch_size=2, seed=0
    )
    with pytest.raises(DataError, match="at least one token") as err:
        list(b.train.batches(0))
    assert err.value.line == 2
