"""Streaming batch sources: split, bounded shuffle buffer, batching, exact per-epoch replay.

A :class:`StreamSource` turns a re-openable stream of parsed examples (``examples()`` reads the
file from the start on every call) into batches:

    examples()  ->  split filter  ->  shuffle buffer  ->  batches of B  ->  collate

* **Split.** ``split=(k, is_valid)`` keeps the rows with 0-based index ``i % k == k - 1``
  (validation) or the others (training); the index counts parsed examples in file order.
* **Shuffle buffer** (``shuffle_buffer = S``): hold up to S examples; once full, each new
  example replaces a uniformly chosen held one, which is emitted; at the end the remainder is
  shuffled and emitted. Every example is emitted exactly once, memory is O(S) whatever the file
  size, and ``S >= N`` gives a uniform permutation. The RNG is ``random.Random`` seeded from
  ``(seed, name, epoch)``, so epoch ``e`` is a pure function of ``(seed, e)``: the trainer
  resumes mid-epoch by calling ``batches(e)`` again and skipping ``k`` batches (or passing
  ``start=k``, which skips the collation of those batches but still reads them).
* **Length buckets** (``bucket_batches = K``, with a ``length`` of an example): the shuffled
  stream is cut into windows of ``K * B`` examples; each window is sorted by length (stable)
  and cut into ``K`` batches, emitted in an order shuffled from ``(seed, name, epoch,
  window)``. Batches of similar lengths waste little on padding (sentences padded to the
  longest of a random batch are ~40% tokens here) while every example still comes once per
  epoch; the last ``N mod B`` examples of an epoch form the partial batch in stream order, so
  ``drop_last`` drops no particular lengths. Order stays a pure function of ``(seed, epoch)``.
* **Collate** receives the examples of one batch and a batch seed derived from
  ``(seed, name, epoch, batch_index)`` (random masking draws from it, so it replays exactly);
  a source built with ``epoch_seeds=False`` (validation) uses epoch 0 for every epoch.

The number of examples of a file is unknown until one epoch has been read to the end, a loader
pass counted it (the tokenizer pass of JSONL / CSV, NPZ headers) or :meth:`StreamSource.count`
made a counting pass; :meth:`BatchSource.num_batches` returns ``None`` until then.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from engine.configs import ConfigError
from engine.data.errors import DataError

if TYPE_CHECKING:
    from engine.data.config import DataConfig

__all__ = [
    "BatchSource",
    "StreamSource",
    "DataBundle",
    "derive_seed",
    "shuffle_buffered",
    "pad_batch",
    "read_lines",
    "train_valid_sources",
    "line_examples",
]

Collate = Callable[[list[Any], int], dict[str, Tensor]]  # (examples, batch_seed) -> batch


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts, stable across processes and Python versions."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def shuffle_buffered(items: Iterable[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Bounded shuffle buffer of ``size`` items (see the module docstring); ``size <= 1``:
    the input order."""
    if size <= 1:
        yield from items
        return
    buf: list[Any] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        out, buf[j] = buf[j], item
        yield out
    rng.shuffle(buf)
    yield from buf


def read_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of a UTF-8 file, streamed; bad UTF-8 raises :class:`DataError`.

    Lines keep their terminator; a byte-order mark on line 1 is dropped.
    """
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    path, n, f"expected UTF-8 text ({e.reason} at byte {e.start})"
                ) from None
            yield n, (line[1:] if n == 1 and line.startswith("\ufeff") else line)


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, length: int | None = None) -> Tensor:
    """``(B, S)`` long tensor, right-padded with ``pad_id`` to ``length`` (default: longest)."""
    s = max((len(x) for x in seqs), default=0) if length is None else length
    out = torch.full((len(seqs), s), pad_id, dtype=torch.long)  # (B, S)
    for i, x in enumerate(seqs):
        out[i, : len(x)] = torch.as_tensor(x, dtype=torch.long)
    return out


class BatchSource:
    """What the trainer consumes: deterministic batches per epoch (dicts of tensors)."""

    batch_size: int = 1
    drop_last: bool = False

    def batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, Tensor]]:
        raise NotImplementedError

    def num_examples(self) -> int | None:
        """Examples per epoch, or ``None`` if unknown without a pass over the file."""
        raise NotImplementedError

    def count(self) -> int:
        """Make a counting pass so :meth:`num_examples` is known; returns the count."""
        raise NotImplementedError

    def num_batches(self) -> int | None:
        """Batches per epoch, or ``None`` if unknown without a pass over the file."""
        n = self.num_examples()
        if n is None:
            return None
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)


class StreamSource(BatchSource):
    """Batches from a re-readable example stream (file or in-memory list)."""

    def __init__(
        self,
        examples: Callable[[], Iterable[Any]],
        collate: Collate,
        *,
        batch_size: int,
        seed: int,
        shuffle_buffer: int,
        drop_last: bool = False,
        split: tuple[int, bool] | None = None,
        name: str = "train",
        num_examples: int | None = None,
        epoch_seeds: bool = True,
        bucket_batches: int = 0,
        length: Callable[[Any], int] | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if bucket_batches > 1 and length is None:
            raise ValueError("length buckets need the length of an example")
        if split is not None and split[0] < 2:
            raise ValueError(f"split period must be >= 2, got {split[0]}")
        self._examples = examples
        self._collate = collate
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.drop_last = drop_last
        self.split = split
        self.name = name
        self.epoch_seeds = epoch_seeds
        self._num_examples = num_examples
        self.bucket_batches = bucket_batches
        self._length = length

    def num_examples(self) -> int | None:
        return self._num_examples

    def count(self) -> int:
        """Count this split's examples with one pass (parses every row, no shuffle or collate),
        so that :meth:`num_batches` is known before training; returns the count."""
        n = sum(1 for _ in self._split(self._examples()))
        self._num_examples = n
        return n

    def _split(self, stream: Iterable[Any]) -> Iterator[Any]:
        if self.split is None:
            yield from stream
            return
        k, is_valid = self.split
        for i, ex in enumerate(stream):
            if (i % k == k - 1) == is_valid:
                yield ex

    def examples(self, epoch: int) -> Iterator[Any]:
        """This split's examples in the order of epoch ``epoch`` (after the shuffle buffer)."""
        stream = self._split(self._examples())
        if self.shuffle_buffer <= 1:
            return iter(stream)
        rng = random.Random(derive_seed("shuffle", self.seed, self.name, epoch))
        return shuffle_buffered(stream, self.shuffle_buffer, rng)

    def batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, Tensor]]:
        """Batches of epoch ``epoch`` (a pure function of ``(seed, epoch)``), from ``start``."""
        for name, v in (("epoch", epoch), ("start", start)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        seed_epoch = epoch if self.epoch_seeds else 0
        index = 0
        for batch in self._groups(epoch):
            if len(batch) < self.batch_size and self.drop_last:
                continue
            if index >= start:
                yield self._collate(batch, self._batch_seed(seed_epoch, index))
            index += 1

    def _groups(self, epoch: int) -> Iterator[list[Any]]:
        """The examples of epoch ``epoch`` in batches, read a window of ``max(K, 1)`` batches
        at a time (:meth:`_cut`); the last batch may be partial and keeps the stream order.
        Counts the examples when the stream ends."""
        count, window, w_index = 0, [], 0
        size = self.batch_size * max(self.bucket_batches, 1)
        for ex in self.examples(epoch):
            count += 1
            window.append(ex)
            if len(window) == size:
                yield from self._cut(window, epoch, w_index)
                window, w_index = [], w_index + 1
        full = len(window) - len(window) % self.batch_size
        yield from self._cut(window[:full], epoch, w_index)
        if full < len(window):
            yield window[full:]  # the partial batch, in stream order
        self._num_examples = count

    def _cut(self, window: list[Any], epoch: int, w_index: int) -> list[list[Any]]:
        """``window`` (a multiple of B examples) in batches; with length buckets sorted by
        length first (stable: ties keep the stream order) and the batches shuffled."""
        if self.bucket_batches > 1:
            assert self._length is not None
            window = sorted(window, key=self._length)
        out = [window[i : i + self.batch_size] for i in range(0, len(window), self.batch_size)]
        if self.bucket_batches > 1:
            random.Random(derive_seed("bucket", self.seed, self.name, epoch, w_index)).shuffle(out)
        return out

    def _batch_seed(self, epoch: int, index: int) -> int:
        return derive_seed("batch", self.seed, self.name, epoch, index)


@dataclass
class DataBundle:
    """Everything :func:`engine.data.build_data` gives the trainer.

    ``model_overrides`` are the model-config fields the data determines (vocabulary, classes,
    feature counts); ``artifacts`` are files a job must keep (``tokenizer``, ``labels``);
    ``info`` is JSON-able description (row counts when known, labels, oracle accuracy, ...).
    """

    train: BatchSource
    valid: BatchSource | None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    # the validation rows by where they come from (a mix of text sources), each a source of
    # its own: the trainer reports each stage's metrics on every part beside the whole
    valid_parts: dict[str, BatchSource] = field(default_factory=dict)


def split_counts(total: int, every: int) -> tuple[int, int]:
    """``(train, valid)`` example counts of the ``valid_every = every`` split of ``total``."""
    return total - total // every, total // every


def train_valid_sources(
    train_examples: Callable[[], Iterable[Any]],
    valid_examples: Callable[[], Iterable[Any]] | None,
    *,
    collate: Collate,
    batch_size: int,
    seed: int,
    shuffle_buffer: int,
    drop_last: bool,
    valid_every: int,
    counts: tuple[int | None, int | None] = (None, None),
    length_buckets: int = 0,
    length: Callable[[Any], int] | None = None,
) -> tuple[StreamSource, StreamSource | None]:
    """The training source and the validation source (explicit stream, split, or none).

    Validation is read in order (no shuffle, no length buckets), keeps its last partial batch
    and uses the same batch seeds every epoch, so its metrics are comparable across epochs.
    ``length_buckets`` > 1 buckets the training batches by ``length`` (module docstring).
    """
    if length_buckets > 1 and length is None:
        raise ConfigError(
            "data.length_buckets", "only sentence and text data can be bucketed by length; use 0"
        )
    common = {"collate": collate, "batch_size": batch_size, "seed": seed}
    if valid_examples is None and valid_every:
        split_t, split_v = (valid_every, False), (valid_every, True)
        valid_examples = train_examples
    else:
        split_t = split_v = None
    train = StreamSource(
        train_examples,
        shuffle_buffer=shuffle_buffer,
        drop_last=drop_last,
        split=split_t,
        num_examples=counts[0],
        bucket_batches=length_buckets,
        length=length,
        **common,
    )
    if valid_examples is None:
        return train, None
    valid = StreamSource(
        valid_examples,
        shuffle_buffer=0,
        split=split_v,
        name="valid",
        num_examples=counts[1],
        epoch_seeds=False,
        **common,
    )
    return train, valid


def line_examples(
    cfg: DataConfig,
    train: Callable[[], Iterable[Any]],
    valid: Callable[[], Iterable[Any]] | None,
    in_memory: bool,
) -> dict[str, Any]:
    """The examples, counts and ``cfg``'s loader settings that :func:`train_valid_sources`
    takes, for examples read from text lines. ``in_memory``: each split is read once and
    kept (its count known; a shuffling training source buffers all of it), else streamed
    (counts ``None``)."""

    def kept(examples: Callable[[], Iterable[Any]]) -> Callable[[], Iterable[Any]]:
        if not in_memory:
            return examples
        cached = list(examples())
        return lambda: cached

    train_ex = kept(train)
    valid_ex = kept(valid) if valid is not None else None
    counts: tuple[int | None, int | None] = (None, None)
    if in_memory:
        counts = (len(train_ex()), len(valid_ex()) if valid_ex is not None else None)
    return {
        "train_examples": train_ex,
        "valid_examples": valid_ex,
        "counts": counts,
        "shuffle_buffer": (counts[0] or 0)
        if cfg.shuffle_buffer and in_memory
        else cfg.shuffle_buffer,
        "drop_last": cfg.drop_last,
        "valid_every": cfg.valid_every,
        "length_buckets": cfg.length_buckets,
    }
