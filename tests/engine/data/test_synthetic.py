"""Synthetic generators: determinism, the structure they promise, file == in-memory."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from engine.data import DataConfig, build_data, write_synthetic
from engine.data.config import params_from_dict
from engine.data.synthetic_tabular import CriteoParams, MLPParams, generate_criteo, generate_mlp
from engine.data.synthetic_text import (
    NEGATIONS,
    NLI_LABELS,
    MLMParams,
    NLIParams,
    _chain,
    generate_mlm,
    generate_nli,
    nli_label,
)

ARCH = {"nli": "transformer", "criteo": "dlrm", "mlm": "mlm", "mlp": "mlp"}


def _draw(gen, n, seed, **params):
    if gen == "nli":
        return generate_nli(n, seed, NLIParams(**params))[0]
    if gen == "mlm":
        return generate_mlm(n, seed, MLMParams(**params))[0]
    if gen == "criteo":
        return generate_criteo(n, seed, CriteoParams(**params))[0]
    x, y, _ = generate_mlp(n, seed, MLPParams(**params))
    return [(r.tobytes(), int(c)) for r, c in zip(x, y, strict=True)]


@pytest.mark.parametrize("gen", ["nli", "mlm", "criteo", "mlp"])
def test_deterministic_by_seed_and_prefix_stable(gen):
    a, b = _draw(gen, 300, 1), _draw(gen, 300, 1)
    assert a == b and a != _draw(gen, 300, 2)
    assert _draw(gen, 9000, 1)[:300] == a  # crosses a block boundary for the tabular ones


@pytest.mark.parametrize("topics", [1, 8])
def test_nli_labels_follow_the_rule(topics):
    rows = generate_nli(3000, 0, NLIParams(n_topics=topics))[0]
    counts = Counter(y for _, _, y in rows)
    assert set(counts) == set(NLI_LABELS) and min(counts.values()) > 900
    for a, b, y in rows:
        p, h = a.split(), b.split()
        assert nli_label(p, h) == y and len(set(p)) == len(p)
        if y == "contradiction":
            assert sum(w in NEGATIONS for w in h) == 1
        if y == "neutral":
            assert not set(h) & set(p)
    # the hypothesis alone does not give the label away: its words appear under every label
    by_word = {}
    for _, b, y in rows:
        for w in b.split():
            by_word.setdefault(w, set()).add(y)
    assert np.mean([len(v) >= 2 for w, v in by_word.items() if w not in NEGATIONS]) > 0.9


def test_mlm_sentences_follow_the_chain_and_are_predictable():
    params = MLMParams()
    lines, info = generate_mlm(500, 0, params)
    words, trans, start = _chain(params, 0)
    index = {w: i for i, w in enumerate(words)}
    for line in lines:
        s = [index[w] for w in line.split()]
        assert params.min_len <= len(s) <= params.max_len and start[s[0]] > 0
        assert all(trans[u, v] > 0 for u, v in zip(s, s[1:], strict=False))
    assert info["oracle_accuracy"] > info["unigram_accuracy"] + 0.5


def test_criteo_click_structure_beats_base_rate():
    lines, info = generate_criteo(20_000, 0, CriteoParams())
    labels = np.array([int(x[:1]) for x in lines])
    assert abs(labels.mean() - 0.25) < 0.03 and info["positive_rate"] == labels.mean()
    assert info["oracle_accuracy"] > info["base_rate"] + 0.1
    fields = [x.rstrip(b"\n").split(b"\t") for x in lines[:2000]]
    assert all(len(f) == 40 for f in fields)
    missing = np.mean([f[j] == b"" for f in fields for j in range(1, 40)])
    assert 0.03 < missing < 0.07  # missing_rate 0.05
    # per-category click rates of one table differ far beyond binomial noise (chi-square)
    cats = [x.split(b"\t")[25] for x in lines]  # C12: 1000 categories, no interaction term
    chi2, df, p = 0.0, -1, labels.mean()
    for c, n in Counter(cats).items():
        if n >= 100:
            k = labels[[i for i, v in enumerate(cats) if v == c]].sum()
            chi2, df = chi2 + (k - n * p) ** 2 / (n * p * (1 - p)), df + 1
    assert df >= 10 and chi2 > 3 * df


def test_mlp_clusters_are_separable():
    x, y, info = generate_mlp(4000, 0, MLPParams(shape=(4, 8)))
    assert x.shape == (4000, 4, 8) and x.dtype == np.float32 and y.dtype == np.int64
    assert set(np.unique(y)) == {0, 1, 2, 3} and info["oracle_accuracy"] > 0.9
    # nearest class mean (estimated on half) classifies the other half well above chance
    flat = x.reshape(4000, -1)
    means = np.stack([flat[:2000][y[:2000] == c].mean(0) for c in range(4)])
    pred = ((flat[2000:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == y[2000:]).mean() > 0.5


@pytest.mark.parametrize(
    "gen,fmt", [("nli", "jsonl"), ("nli", "csv"), ("criteo", None), ("mlm", None), ("mlp", None)]
)
def test_files_load_to_the_same_examples_as_memory(tmp_path, gen, fmt):
    files = write_synthetic(gen, tmp_path / "f", n_train=120, n_valid=30, seed=3, fmt=fmt)
    assert files.kind == (fmt or {"criteo": "criteo", "mlm": "text", "mlp": "npz"}[gen])
    common = {"shuffle_buffer": 0, "num_rows": 5000, "vocab_size": 300, "max_len": 32}
    mem = build_data(
        DataConfig(generator=gen, n_train=120, n_valid=30, synthetic_seed=3, **common),
        arch=ARCH[gen],
        batch_size=16,
        seed=0,
        workdir=tmp_path / "w",
    )
    disk = build_data(
        files.config(**common), arch=ARCH[gen], batch_size=16, seed=0, workdir=tmp_path / "w"
    )
    assert mem.model_overrides == disk.model_overrides
    for a, b in ((mem.train, disk.train), (mem.valid, disk.valid)):
        xs, ys = list(a.batches(1)), list(b.batches(1))
        assert len(xs) == len(ys) and sum(len(x["labels"]) for x in xs) == a.num_examples()
        for x, y in zip(xs, ys, strict=True):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_params_are_validated_with_field_names():
    with pytest.raises(ValueError, match=r"data\.params\.bogus: unknown parameter .*\['bogus'\]"):
        params_from_dict(NLIParams, {"bogus": 1}, "nli")
    with pytest.raises(ValueError, match=r"data\.params\.n_topics"):
        NLIParams(n_topics=0)
    with pytest.raises(ValueError, match=r"data\.params\.n_words / n_topics"):
        NLIParams(n_words=30, n_topics=8)
    with pytest.raises(ValueError, match=r"data\.params\.missing_rate"):
        CriteoParams(missing_rate=1.5)
    with pytest.raises(ValueError, match=r"data\.params\.shape"):
        MLPParams(shape=(3, 0))
    with pytest.raises(ValueError, match=r"data\.params\.branching"):
        MLMParams(n_words=10, branching=6)
    assert params_from_dict(CriteoParams, {"cardinality": [5, 7]}, "criteo").cardinality == (5, 7)


def test_the_generator_registry_is_the_configs_choice_list():
    from engine.data.config import GENERATORS as CHOICES
    from engine.data.synthetic import GENERATOR_OF_ARCH, GENERATORS, get_generator

    assert set(GENERATORS) == set(CHOICES)
    assert GENERATOR_OF_ARCH == {a: g for g, a in ARCH.items()} | {"hf_bert": "stdlib_text"}
    assert get_generator("nli").formats == ("jsonl", "csv")
    with pytest.raises(ValueError, match=r"data.generator: must be one of \['criteo', "):
        get_generator("nope")


def test_a_name_registers_once():
    from engine.data.synthetic import GENERATORS, register_generator

    before = dict(GENERATORS)
    with pytest.raises(ValueError, match="already registered"):
        register_generator(
            "mlp", arch="mlp", params=MLPParams, formats=("npz",), write=lambda *a: {}
        )(lambda r: None)
    assert GENERATORS == before
