"""Streaming machinery: bounded shuffle buffer, split, exact per-epoch replay, batching."""

from __future__ import annotations

import random

import pytest
import torch

from engine.data.source import (
    StreamSource,
    derive_seed,
    pad_batch,
    shuffle_buffered,
    split_counts,
    train_valid_sources,
)


def _collate(ex, seed):
    return {"x": torch.tensor(ex), "seed": torch.tensor([seed])}


def _source(n=23, **kw):
    args = {"batch_size": 4, "seed": 3, "shuffle_buffer": 5}
    args.update(kw)
    return StreamSource(lambda: iter(range(n)), _collate, **args)


def _split(n, *, batch_size, valid_every, shuffle_buffer=8, drop_last=False, **kw):
    """``train_valid_sources`` over the examples ``0 .. n-1`` (no validation file)."""
    return train_valid_sources(
        lambda: iter(range(n)),
        None,
        collate=_collate,
        batch_size=batch_size,
        seed=0,
        shuffle_buffer=shuffle_buffer,
        drop_last=drop_last,
        valid_every=valid_every,
        **kw,
    )


def _rows(source, epoch, **kw):
    return [int(v) for b in source.batches(epoch, **kw) for v in b["x"]]


@pytest.mark.parametrize("size", [0, 1, 2, 7, 29, 30, 31, 100])
def test_shuffle_buffer_emits_every_item_once_and_never_reads_ahead(size):
    items = list(range(30))
    out = list(shuffle_buffered(iter(items), size, random.Random(size)))
    assert sorted(out) == items
    for i, x in enumerate(out[: max(0, len(items) - size)]):
        # before the final flush, output i is emitted after reading i + size items
        assert x < i + max(size, 1)
    if size <= 1:
        assert out == items


def test_shuffle_buffer_larger_than_input_is_a_uniform_permutation():
    n, trials = 4, 4000
    first = [0] * n
    for t in range(trials):
        first[next(shuffle_buffered(iter(range(n)), 10, random.Random(t)))] += 1
    assert all(abs(c / trials - 1 / n) < 0.04 for c in first), first


def test_epoch_is_a_pure_function_of_seed_and_epoch():
    a, b = _source(), _source()
    for e in (0, 1, 5):
        assert _rows(a, e) == _rows(b, e) == _rows(a, e)
    assert _rows(a, 0) != _rows(a, 1)
    assert _rows(a, 0) != _rows(_source(seed=4), 0)
    assert sorted(_rows(a, 2)) == list(range(23))


def test_start_skips_exactly_k_batches_and_batch_seeds_replay():
    s = _source()
    full = list(s.batches(3))
    for k in (0, 1, 4, 5, 6):
        tail = list(s.batches(3, start=k))
        assert len(tail) == max(0, len(full) - k)
        for x, y in zip(full[k:], tail, strict=True):
            assert torch.equal(x["x"], y["x"]) and torch.equal(x["seed"], y["seed"])
    seeds = {int(b["seed"]) for b in full} | {int(b["seed"]) for b in s.batches(4)}
    assert len(seeds) == 2 * len(full)  # distinct per batch and per epoch


@pytest.mark.parametrize("drop_last", [False, True])
def test_batching_keeps_or_drops_the_partial_batch(drop_last):
    s = _source(n=23, shuffle_buffer=0, drop_last=drop_last)
    assert s.num_batches() is None  # unknown before a pass
    sizes = [len(b["x"]) for b in s.batches(0)]
    assert sizes == ([4] * 5 if drop_last else [4] * 5 + [3])
    assert s.num_examples() == 23 and s.num_batches() == len(sizes)


def test_abandoned_pass_does_not_record_a_count():
    s = _source()
    next(s.batches(0))
    assert s.num_examples() is None


@pytest.mark.parametrize("k", [2, 3, 7])
def test_split_partitions_rows_by_index(k):
    n = 40
    train, valid = _split(n, batch_size=3, valid_every=k)
    tr, va = sorted(_rows(train, 1)), _rows(valid, 1)
    assert va == [i for i in range(n) if i % k == k - 1]  # in order, unshuffled
    assert tr == [i for i in range(n) if i % k != k - 1]
    assert (len(tr), len(va)) == split_counts(n, k)
    # validation batch seeds do not change with the epoch
    assert [int(b["seed"]) for b in valid.batches(0)] == [int(b["seed"]) for b in valid.batches(5)]


def test_no_validation_without_file_or_split():
    train, valid = _split(5, batch_size=2, valid_every=0, shuffle_buffer=0)
    assert valid is None and _rows(train, 0) == list(range(5))


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        _source(batch_size=0)
    with pytest.raises(ValueError, match="epoch"):
        next(_source().batches(-1))
    with pytest.raises(ValueError, match="start"):
        next(_source().batches(0, start=-2))


def test_pad_batch_and_seed_derivation():
    out = pad_batch([[1, 2, 3], [4]], 0)
    assert out.tolist() == [[1, 2, 3], [4, 0, 0]] and out.dtype == torch.long
    assert pad_batch([[1]], 9, 3).tolist() == [[1, 9, 9]]
    assert derive_seed(1, "a", 2) == derive_seed(1, "a", 2) != derive_seed(1, "a", 3)
    assert 0 <= derive_seed("x") < 2**63


def test_count_makes_num_batches_known_before_training():
    s = _source(n=23)
    assert s.num_batches() is None
    assert s.count() == 23 and s.num_batches() == 6
    train, valid = _split(23, batch_size=4, valid_every=3, drop_last=True)
    assert (train.count(), valid.count()) == split_counts(23, 3) == (16, 7)
    assert (train.num_batches(), valid.num_batches()) == (4, 2)  # validation keeps its last


def _bucket_reference(stream, batch, k, seed, epoch):
    """Brute force: windows of k * batch stream items, each sorted by value (the length here),
    cut into batches, shuffled by the documented seed; the tail in stream order."""
    out, size = [], batch * k
    full = len(stream) - len(stream) % batch
    for w, start in enumerate(range(0, full, size)):
        window = sorted(stream[start : min(start + size, full)])
        cut = [window[i : i + batch] for i in range(0, len(window), batch)]
        random.Random(derive_seed("bucket", seed, "train", epoch, w)).shuffle(cut)
        out += cut
    return out + ([stream[full:]] if full < len(stream) else [])


@pytest.mark.parametrize(("n", "k"), [(23, 2), (23, 3), (40, 2), (7, 4), (64, 1)])
def test_length_buckets_sort_windows_and_keep_every_example_once(n, k):
    plain = _source(n=n, shuffle_buffer=50)
    bucketed = _source(n=n, shuffle_buffer=50, bucket_batches=k, length=lambda x: x)
    for epoch in (0, 1):
        stream = _rows(plain, epoch)  # the shuffled stream both read
        got = [[int(v) for v in b["x"]] for b in bucketed.batches(epoch)]
        want = (
            _bucket_reference(stream, 4, k, 3, epoch)
            if k > 1
            else [stream[i : i + 4] for i in range(0, n, 4)]
        )
        assert got == want
        assert sorted(v for b in got for v in b) == list(range(n))
    assert bucketed.num_examples() == n


def test_length_buckets_cut_padding_replay_and_resume():
    lengths = [random.Random(i).randrange(1, 60) for i in range(256)]

    def source(**kw):  # examples of these lengths, each its own length
        return StreamSource(
            lambda: iter(lengths),
            lambda ex, seed: {"x": torch.tensor(ex)},
            batch_size=16,
            seed=0,
            shuffle_buffer=256,
            **kw,
        )

    s, plain = source(bucket_batches=8, length=lambda x: x), source()

    def padded(src):  # tokens computed when every batch is padded to its longest row
        return sum(len(b["x"]) * int(b["x"].max()) for b in src.batches(0))

    assert padded(s) < 0.75 * padded(plain)
    full = list(s.batches(2))
    for start in (0, 3, 15):
        tail = list(s.batches(2, start=start))
        assert all(torch.equal(a["x"], b["x"]) for a, b in zip(full[start:], tail, strict=True))


@pytest.mark.parametrize("drop_last", [False, True])
def test_length_buckets_drop_only_the_stream_tail(drop_last):
    s = _source(n=23, shuffle_buffer=0, drop_last=drop_last, bucket_batches=2, length=lambda x: -x)
    got = [[int(v) for v in b["x"]] for b in s.batches(0)]
    assert [len(b) for b in got[:5]] == [4] * 5
    assert got[5:] == ([] if drop_last else [[20, 21, 22]])  # the last 3 of the stream


def test_length_buckets_need_a_length():
    with pytest.raises(ValueError, match="length"):
        _source(bucket_batches=2)
    with pytest.raises(ValueError, match="data.length_buckets"):
        _split(0, batch_size=2, valid_every=0, shuffle_buffer=0, length_buckets=4)
