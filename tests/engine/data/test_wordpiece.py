"""WordPiece vocabulary training: the merges worked by hand, ties, order independence."""

from __future__ import annotations

import random

from engine.data.synthetic_text import MLMParams, generate_mlm
from engine.data.tokenizer import SPECIAL_TOKENS, train_wordpiece
from engine.data.wordpiece import train_vocab

COUNTS = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
ALPHABET = ["b", "g", "h", "n", "p", "s", "u", "##g", "##n", "##s", "##u"]


def test_merges_follow_counts_and_break_ties_by_ids():
    pieces = train_vocab(COUNTS, vocab_size=100, special_tokens=SPECIAL_TOKENS)
    # ##u ##g 20, ##u ##n 16, h ##ug 15, p ##un 12; then p ##ug and hug ##s tie at 5: the
    # smaller ids (p = 9, ##ug = 16) before (hug = 18, ##s = 14); b ##un 4; then no pair is left
    merges = ["##ug", "##un", "hug", "pun", "pug", "hugs", "bun"]
    assert pieces == [*SPECIAL_TOKENS, *ALPHABET, *merges]
    assert train_vocab(COUNTS, vocab_size=21, special_tokens=SPECIAL_TOKENS) == pieces[:21]


def test_the_vocabulary_does_not_depend_on_the_order_of_words_or_lines():
    reordered = dict(reversed(list(COUNTS.items())))
    kw = {"vocab_size": 20, "special_tokens": SPECIAL_TOKENS}
    assert train_vocab(reordered, **kw) == train_vocab(COUNTS, **kw)
    lines, _ = generate_mlm(400, 0, MLMParams(n_words=60))
    shuffled = random.Random(0).sample(lines, len(lines))
    a = train_wordpiece(iter(lines), vocab_size=120, lowercase=True)
    b = train_wordpiece(iter(shuffled), vocab_size=120, lowercase=True)
    assert a.to_str() == b.to_str()
    assert a.get_vocab_size() == 120
    assert [a.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert all(1 not in a.encode(line).ids for line in lines)  # no [UNK] on its own text
