"""The teacher-embedding table: keys, lookups against the teacher itself, when it is built."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.models.hf_bert import distill_loss, mean_pool
from engine.models.hf_bert.cache import (
    MIN_PASSES,
    TeacherEmbeddings,
    attach_teacher_embeddings_,
    max_rows,
    sentence_keys,
    should_build,
)
from engine.models.hf_bert.config import HFBertConfig
from engine.models.registry import TensorizeOptions, get_workload
from engine.train.config import StageConfig
from tests.helpers.hf_bert import write_tiny_bert


def padded(rows: list[list[int]], width: int, types: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded ``(B, width)`` batch of token rows (pad id 0)."""
    ids = torch.zeros(len(rows), width, dtype=torch.long)  # (B, S)
    mask = torch.zeros(len(rows), width, dtype=torch.long)  # (B, S)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.full_like(ids, types) * mask,
    }


SENTENCES = [
    [101, 7592, 2088, 102],
    [101, 2023, 2003, 1037, 3231, 102],
    [101, 2748, 102],
    [101, 1996, 4937, 2938, 2006, 1996, 13523, 102],
    [101, 2204, 2851, 102],
]


def test_keys_ignore_padding_and_separate_token_types():
    a, b = padded(SENTENCES[:2], 6), padded(SENTENCES[:2], 11)
    assert sentence_keys(*a.values()) == sentence_keys(*b.values())
    assert len(set(sentence_keys(*a.values()))) == 2
    typed = padded(SENTENCES[:2], 6, types=1)
    assert set(sentence_keys(*typed.values())).isdisjoint(sentence_keys(*a.values()))
    assert sentence_keys(a["input_ids"], a["attention_mask"], None) != sentence_keys(*a.values())


@pytest.fixture
def tiny(tmp_path):
    write_tiny_bert(tmp_path)
    cfg = HFBertConfig(path=str(tmp_path))
    return get_workload("hf_bert").build(
        cfg, tensorized=True, options=TensorizeOptions(max_rank=3, d=2)
    )


def teacher_embeddings(model, batch) -> torch.Tensor:
    with torch.no_grad():
        hidden = model.teacher(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    return mean_pool(hidden, batch["attention_mask"])  # (B, D)


def test_lookup_equals_the_teacher_in_any_batching_and_misses_otherwise(tiny):
    built = [padded(SENTENCES[:3], 9), padded(SENTENCES[3:] + SENTENCES[:1], 8)]  # a repeat
    table = TeacherEmbeddings.build(
        tiny.teacher, built, device=torch.device("cpu"), max_rows=10, group=2
    )
    assert table is not None and len(table) == 5 and table.table.shape == (5, 32)
    other = padded([SENTENCES[4], SENTENCES[1], SENTENCES[0]], 12)  # new grouping and padding
    got = table.lookup(*other.values())
    assert got is not None
    torch.testing.assert_close(got, teacher_embeddings(tiny, other), rtol=1e-5, atol=1e-6)
    assert table.lookup(*padded([SENTENCES[0], [101, 999, 102]], 5).values()) is None
    assert (
        TeacherEmbeddings.build(tiny.teacher, built, device=torch.device("cpu"), max_rows=4) is None
    )


def test_distill_loss_with_the_table_equals_the_teacher_path(tiny):
    batch = padded(SENTENCES, 10)
    want, want_sums = distill_loss(tiny, batch)
    (g_want,) = torch.autograd.grad(want, [tiny.encoder.layer[0].attention.self.query.cores[0]])
    tiny.set_teacher_embeddings(
        TeacherEmbeddings.build(tiny.teacher, [batch], device=torch.device("cpu"), max_rows=10)
    )
    calls = []
    hook = tiny.teacher.register_forward_hook(lambda *a: calls.append(1))
    got, got_sums = distill_loss(tiny, padded(SENTENCES, 8))
    assert calls == []  # every sentence found: the teacher did not run
    (g_got,) = torch.autograd.grad(got, [tiny.encoder.layer[0].attention.self.query.cores[0]])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got_sums["cosine_sum"], want_sums["cosine_sum"])
    distill_loss(tiny, padded(SENTENCES[:2] + [[101, 999, 102]], 8))  # one miss: the teacher
    hook.remove()
    assert calls == [1]


def test_the_table_is_built_only_when_it_pays_and_fits():
    assert should_build(0, MIN_PASSES, None, 384)  # epochs known, size found while building
    assert not should_build(10**6, 1.0, None, 384)  # steps over an unknown split: no
    assert should_build(int(MIN_PASSES * 1000), 0.0, 1000, 384)
    assert not should_build(int(MIN_PASSES * 1000) - 1, 0.0, 1000, 384)  # too few passes
    assert should_build(0, MIN_PASSES, max_rows(384), 384)
    assert not should_build(0, 50.0, max_rows(384) + 1, 384)  # over the memory cap
    assert not should_build(100, 0.0, 0, 384)


def test_attach_skips_other_losses_and_short_jobs(tiny):
    stages = [StageConfig.from_dict({"kind": "early", "steps": 4}, "schedule[0]")]
    source = SimpleNamespace(
        num_examples=lambda: 16, batches=lambda epoch: iter([padded(SENTENCES, 9)])
    )
    info = attach_teacher_embeddings_(tiny, source, stages, 8, device=torch.device("cpu"))
    assert info["teacher_embeddings"] == len(SENTENCES) and tiny.teacher_embeddings is not None
    info = attach_teacher_embeddings_(tiny, source, stages, 4, device=torch.device("cpu"))
    assert info["teacher_embeddings"] == 0 and tiny.teacher_embeddings is None  # 4 x 4 = 16
    tiny.config = tiny.config.replace(distill="mse_hidden")
    assert attach_teacher_embeddings_(tiny, source, stages, 8, device=torch.device("cpu")) is None
