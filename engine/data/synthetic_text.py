"""Synthetic text with known, learnable structure: sentence pairs (NLI) and Markov-chain lines.

Both generators first draw a vocabulary of pronounceable nonsense words (2-3 consonant-vowel
syllables, e.g. ``kotami``) from ``rng([seed, 0])``, then the rows from ``rng([seed, 1])``, so
a data set is a pure function of ``(seed, params, n)`` and its first ``n`` rows do not depend
on how many more are drawn (train = first ``n_train`` rows, valid = the next ``n_valid``).

**NLI** (sentence pairs, 3 classes, balanced). The ``n_words`` words are split into
``n_topics`` disjoint topics. The premise is ``min_premise..max_premise`` distinct words of one
random topic; the hypothesis has ``min_hypothesis..max_hypothesis`` words and its label is a
function of the pair (:func:`nli_label`, so the Bayes accuracy is 1):

* ``entailment``: every hypothesis word occurs in the premise (a random subset, shuffled);
* ``contradiction``: premise words plus one negation word (``not`` / ``never`` / ``no``) at a
  random position;
* ``neutral``: words that do not occur in the premise, from another topic (no negation).

The label depends on both sentences (every topic appears in premises and hypotheses alike): a
model must detect the negation token and whether the hypothesis words belong with the premise.
With topics that is a coarse match (8 topics of 8 words by default) that a two-layer d=32
transformer learns in about 1-2k AdamW steps; ``n_topics=1`` draws neutral words from the rest
of the vocabulary and asks for exact word matching, which takes such a model much longer.

**MLM** (text lines). A first-order Markov chain over ``n_words`` words: each word has
``branching`` successors with Dirichlet(1) probabilities, a sentence starts at one of
``2 * branching`` start words and has ``min_len..max_len`` words. A masked word is predictable
from its neighbours: the reported ``oracle_accuracy`` is the accuracy of the Bayes predictor
``argmax_w P(w | prev) P(next | w)`` for one masked word at a time (``unigram_accuracy`` is the
best context-free guess, for comparison).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.configs import ConfigError
from engine.data.config import check_int

__all__ = [
    "NLIParams",
    "MLMParams",
    "NLI_LABELS",
    "NEGATIONS",
    "make_words",
    "generate_nli",
    "generate_mlm",
]

NLI_LABELS = ("entailment", "neutral", "contradiction")
NEGATIONS = ("not", "never", "no")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def make_words(n: int, rng: np.random.Generator, avoid: tuple[str, ...] = ()) -> list[str]:
    """``n`` distinct nonsense words of 2-3 consonant-vowel syllables."""
    seen, words = set(avoid), []
    while len(words) < n:
        k = int(rng.integers(2, 4))
        w = "".join(
            _CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(5)] for _ in range(k)
        )
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


@dataclass(frozen=True)
class NLIParams:
    n_words: int = 64
    n_topics: int = 8
    min_premise: int = 4
    max_premise: int = 8
    min_hypothesis: int = 2
    max_hypothesis: int = 4

    def __post_init__(self) -> None:
        check_int("params.n_words", self.n_words, 20)
        check_int("params.n_topics", self.n_topics, 1)
        check_int("params.min_premise", self.min_premise, 2)
        check_int("params.max_premise", self.max_premise, self.min_premise)
        check_int("params.min_hypothesis", self.min_hypothesis, 2)
        check_int("params.max_hypothesis", self.max_hypothesis, self.min_hypothesis)
        if self.max_hypothesis > self.min_premise:
            raise ConfigError(
                "data.params.max_hypothesis",
                f"must be <= min_premise ({self.min_premise}), got {self.max_hypothesis}",
            )
        need = self.max_premise + (self.max_hypothesis if self.n_topics == 1 else 0)
        if self.n_words // self.n_topics < need:
            raise ValueError(
                f"data.params.n_words / n_topics must be >= {need} words per topic, "
                f"got {self.n_words} / {self.n_topics}"
            )


def nli_label(premise: list[str], hypothesis: list[str]) -> str:
    """The rule the generator follows: negation, else containment in the premise."""
    if any(w in NEGATIONS for w in hypothesis):
        return "contradiction"
    return "entailment" if set(hypothesis) <= set(premise) else "neutral"


def generate_nli(
    n: int, seed: int, params: NLIParams
) -> tuple[list[tuple[str, str, str]], dict[str, Any]]:
    """``n`` rows ``(premise, hypothesis, label)`` and a description of the task."""
    words = make_words(params.n_words, np.random.default_rng([seed, 0]), avoid=NEGATIONS)
    size = params.n_words // params.n_topics
    topics = [words[i * size : (i + 1) * size] for i in range(params.n_topics)]
    rng = np.random.default_rng([seed, 1])
    rows = []
    for _ in range(n):
        k = int(rng.integers(params.min_premise, params.max_premise + 1))
        m = int(rng.integers(params.min_hypothesis, params.max_hypothesis + 1))
        t = int(rng.integers(params.n_topics))
        pool = topics[t]
        idx = rng.choice(len(pool), size=k, replace=False)
        premise = [pool[i] for i in idx]
        label = NLI_LABELS[int(rng.integers(3))]
        if label == "entailment":
            hyp = [premise[i] for i in rng.permutation(k)[:m]]
        elif label == "contradiction":
            hyp = [premise[i] for i in rng.permutation(k)[: m - 1]]
            hyp.insert(int(rng.integers(m)), NEGATIONS[int(rng.integers(len(NEGATIONS)))])
        elif params.n_topics == 1:
            used = set(premise)
            rest = [w for w in pool if w not in used]
            hyp = [rest[i] for i in rng.choice(len(rest), size=m, replace=False)]
        else:
            other = topics[(t + 1 + int(rng.integers(params.n_topics - 1))) % params.n_topics]
            hyp = [other[i] for i in rng.choice(len(other), size=m, replace=False)]
        rows.append((" ".join(premise), " ".join(hyp), label))
    info = {
        "generator": "nli",
        "labels": list(NLI_LABELS),
        "oracle_accuracy": 1.0,
        "n_words": len(words) + len(NEGATIONS),
        "n_topics": params.n_topics,
    }
    return rows, info


@dataclass(frozen=True)
class MLMParams:
    n_words: int = 120
    branching: int = 3
    min_len: int = 6
    max_len: int = 14

    def __post_init__(self) -> None:
        check_int("params.n_words", self.n_words, 10)
        check_int("params.branching", self.branching, 1)
        if 2 * self.branching > self.n_words:
            raise ConfigError("data.params.branching", "must be <= n_words / 2")
        check_int("params.min_len", self.min_len, 2)
        check_int("params.max_len", self.max_len, self.min_len)


def _chain(params: MLMParams, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Words, transition matrix ``T`` (V, V) and start distribution (V,)."""
    rng = np.random.default_rng([seed, 0])
    v = params.n_words
    words = make_words(v, rng)
    trans = np.zeros((v, v))
    for i in range(v):
        nxt = rng.choice(v, size=params.branching, replace=False)
        trans[i, nxt] = rng.dirichlet(np.ones(params.branching))
    start = np.zeros(v)
    start[rng.choice(v, size=2 * params.branching, replace=False)] = 1 / (2 * params.branching)
    return words, trans, start


def _oracle(sents: list[list[int]], trans: np.ndarray, start: np.ndarray) -> tuple[float, float]:
    """Single-mask Bayes accuracy and best unigram accuracy over ``sents``."""
    hit = total = 0
    counts: Counter[int] = Counter()
    for s in sents:
        counts.update(s)
        for j, w in enumerate(s):
            p = (start if j == 0 else trans[s[j - 1]]).copy()
            if j + 1 < len(s):
                p *= trans[:, s[j + 1]]
            hit += int(np.argmax(p) == w)
            total += 1
    return hit / max(total, 1), max(counts.values(), default=0) / max(total, 1)


def generate_mlm(n: int, seed: int, params: MLMParams) -> tuple[list[str], dict[str, Any]]:
    """``n`` sentences (one per line) from the Markov chain, and the oracle figures."""
    words, trans, start = _chain(params, seed)
    rng = np.random.default_rng([seed, 1])
    cum_t, cum_s = trans.cumsum(1), start.cumsum()
    sents = []
    for _ in range(n):
        length = int(rng.integers(params.min_len, params.max_len + 1))
        u = rng.random(length)
        s = [min(int(np.searchsorted(cum_s, u[0], side="right")), len(words) - 1)]
        for j in range(1, length):
            s.append(min(int(np.searchsorted(cum_t[s[-1]], u[j], side="right")), len(words) - 1))
        sents.append(s)
    oracle, unigram = _oracle(sents[: min(n, 2000)], trans, start)
    info = {
        "generator": "mlm",
        "n_words": len(words),
        "oracle_accuracy": oracle,
        "unigram_accuracy": unigram,
    }
    return [" ".join(words[i] for i in s) for s in sents], info
