"""A student module that carries its frozen teacher outside its module tree.

The teacher adds no parameters, optimizer state or state-dict entries, is kept in eval mode
with ``requires_grad`` off, and follows the student's ``.to()`` / ``.double()``. Shared by the
``hf`` student (:class:`engine.models.hf.model.HFModel`) and the ``hf_bert`` one
(:class:`engine.models.hf_bert.model.SentenceEncoder`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

__all__ = ["WithTeacher"]


class WithTeacher(nn.Module):
    """``teacher``: the frozen original (``None`` until :meth:`set_teacher`)."""

    def __init__(self) -> None:
        super().__init__()
        self.__dict__["teacher"] = None
        self.__dict__["teacher_embeddings"] = None

    @property
    def teacher_embeddings(self) -> Any:
        """The teacher's pooled embeddings of the training split, when a loss reads only
        those (:class:`engine.models.hf_bert.cache.TeacherEmbeddings`; ``None``: none)."""
        return self.__dict__["teacher_embeddings"]

    def set_teacher_embeddings(self, table: Any) -> None:
        self.__dict__["teacher_embeddings"] = table

    def cached_distillation(self) -> tuple[int, Callable[..., Tensor]] | None:
        """``(width, embed)`` when the loss reads the teacher only through ``embed(ids, mask,
        types) -> (B, width)``, which a table may then hold; ``None`` (the default): the
        teacher runs every step."""
        return None

    @property
    def teacher(self) -> Any:
        return self.__dict__["teacher"]

    def set_teacher(self, teacher: nn.Module | None) -> None:
        if teacher is not None:
            teacher.eval().requires_grad_(False)
        self.__dict__["teacher"] = teacher

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Any:
        super()._apply(fn, recurse)
        if self.teacher is not None:
            self.teacher._apply(fn, recurse)
        return self
