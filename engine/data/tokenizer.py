"""WordPiece tokenizer: trained on the training text (streamed) or loaded from tokenizer.json.

Training uses the ``tokenizers`` library exactly like BERT: ``BertNormalizer`` (optionally
lowercasing, accent stripping with it), ``BertPreTokenizer`` (whitespace and punctuation),
``WordPiece`` with ``##`` continuation pieces and the special tokens ``[PAD] [UNK] [CLS] [SEP]
[MASK]`` at ids 0..4. The text comes from an iterator that reads the file line by line, so the
file is never held in memory (the trainer only keeps word counts). The vocabulary is trained
by :func:`engine.data.wordpiece.train_vocab`, the library's algorithm with its orders fixed:
the same text gives the same tokenizer, ids included, in every process (the library's own
trainer breaks ties in a hash-map order seeded at random per process).

Whatever its origin, :func:`prepare` fixes the encoding contract of the loaders: the
post-processor builds ``[CLS] a [SEP]`` (type ids 0) or ``[CLS] a [SEP] b [SEP]`` (type ids
0 for a and its [SEP], 1 for b and its [SEP]); truncation is longest-first to ``max_len``
tokens, special tokens included; padding is left to the collate function. A loaded
tokenizer.json must contain the five special tokens; its normalizer and model are used as they
are (``lowercase`` applies only to training).

:func:`obtain_tokenizer` gives a job a stable tokenizer: the configured file, else
``workdir/tokenizer.json`` if an earlier run (or the resumed job) saved one, else a freshly
trained one, which is then saved there (atomically), so a resumed job reuses identical ids.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from engine.data.errors import DataError
from engine.data.wordpiece import count_words, train_vocab

__all__ = [
    "SPECIAL_TOKENS",
    "SpecialIds",
    "train_wordpiece",
    "load_tokenizer",
    "prepare",
    "obtain_tokenizer",
    "TOKENIZER_FILE",
]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the special tokens of one tokenizer."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    def all(self) -> tuple[int, ...]:
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


def train_wordpiece(texts: Iterable[str], *, vocab_size: int, lowercase: bool) -> Tokenizer:
    """A BERT-style WordPiece tokenizer trained on ``texts`` (consumed once, streamed)."""
    normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts = count_words(texts, normalizer, pre_tokenizer)
    pieces = train_vocab(counts, vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS)
    vocab = {p: i for i, p in enumerate(pieces)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer from a ``tokenizer.json``; a bad file raises :class:`DataError`."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception for unreadable files
        raise DataError(path, None, f"expected a tokenizers tokenizer.json ({e})") from None


def special_ids(tok: Tokenizer, origin: str | Path) -> SpecialIds:
    ids = {}
    for t in SPECIAL_TOKENS:
        i = tok.token_to_id(t)
        if i is None:
            raise DataError(origin, None, f"expected the special token {t} in the vocabulary")
        ids[t.strip("[]").lower()] = i
    return SpecialIds(**ids)


def prepare(tok: Tokenizer, max_len: int, origin: str | Path = "<tokenizer>") -> SpecialIds:
    """Set the ``[CLS] a [SEP] b [SEP]`` template and longest-first truncation to ``max_len``."""
    ids = special_ids(tok, origin)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids.cls), ("[SEP]", ids.sep)],
    )
    tok.no_padding()
    tok.enable_truncation(max_length=max_len, strategy="longest_first")
    return ids


def obtain_tokenizer(
    *,
    given: str | None,
    workdir: str | Path | None,
    texts: Callable[[], Iterable[str]],
    vocab_size: int,
    lowercase: bool,
) -> tuple[Tokenizer, str | None, str]:
    """``(tokenizer, saved path or None, origin)`` where origin is loaded / reused / trained."""
    if given is not None:
        return load_tokenizer(given), str(given), "loaded"
    path = Path(workdir) / TOKENIZER_FILE if workdir is not None else None
    if path is not None and path.exists():
        return load_tokenizer(path), str(path), "reused"
    tok = train_wordpiece(texts(), vocab_size=vocab_size, lowercase=lowercase)
    if path is None:
        return tok, None, "trained"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return tok, str(path), "trained"
