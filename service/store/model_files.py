"""What the worker's libraries will read from a model directory, checked without them (no torch).

:mod:`service.store.model_source` reads the headers; the checks here refuse, at submission,
what ``safetensors`` and ``tokenizers`` would refuse later in the worker (where a refusal
failed the job and named ``/compression`` or ``/dataset``, not the model):

* each tensor of ``model.safetensors``: a dtype the loader knows (``DTYPE_BYTES``, the dtypes
  ``safetensors.torch`` maps, with their sizes), a shape of integers >= 0, and a byte range
  whose length is the one its dtype and shape declare; the ranges, in order, cover the data
  after the header exactly, without gaps or overlaps (what ``safetensors`` validates). A
  header may not declare a 40 GB tensor over zero bytes.
* ``tokenizer.json``: at most ``MAX_TOKENIZER_BYTES``, JSON nested at most
  ``json_limits.MAX_DEPTH`` levels, an object whose ``model`` holds a vocabulary, and (for
  BERT inputs: ``hf_bert``, and the ``bert`` / ``distilbert`` families of ``hf``) the special
  tokens the engine's BERT inputs use (``SPECIAL_TOKENS``) in the vocabulary or the added
  tokens. The planner then loads it with ``tokenizers`` (``worker.data_facts``).

Every refusal is a ``SpecError`` naming the model's pointer; files are named relative to the
data root (``where``), never by their server path.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

from api_schemas.engine_spec import SpecError
from service.store import json_limits

__all__ = [
    "DTYPE_BYTES",
    "MAX_TOKENIZER_BYTES",
    "SPECIAL_TOKENS",
    "check_tensors",
    "check_tokenizer",
    "read_header",
]

DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2": 1,
    "F8_E5M2FNUZ": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
MAX_TOKENIZER_BYTES = 16 << 20  # BERT's multilingual tokenizer.json: 2 MB
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # engine.data.tokenizer's


def _ints(value: Any, length: int | None = None) -> bool:
    return (
        isinstance(value, list)
        and (length is None or len(value) == length)
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)
    )


def _tensor_bytes(name: str, entry: Any, pointer: str, where: str) -> tuple[int, int]:
    """The byte range ``(begin, end)`` of one header entry, its declared size checked."""
    shown = f"{where}: tensor {name[:80]!r}"
    if not isinstance(entry, dict):
        raise SpecError(pointer, f"{shown} is not described by an object")
    dtype, shape, span = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise SpecError(
            pointer,
            f"{shown} has the unknown dtype {str(dtype)[:20]!r} (known: {list(DTYPE_BYTES)})",
        )
    if not _ints(shape) or not _ints(span, 2) or span[0] > span[1]:
        raise SpecError(pointer, f"{shown} has no valid shape or byte range")
    declared = math.prod(shape) * DTYPE_BYTES[dtype]
    if declared != span[1] - span[0]:
        raise SpecError(
            pointer,
            f"{shown} declares {dtype} {shape[:8]} ({declared:,} bytes) over a range of "
            f"{span[1] - span[0]:,} bytes",
        )
    return span[0], span[1]


def check_tensors(header: dict[str, Any], payload: int, pointer: str, where: str) -> None:
    """Every tensor of a safetensors ``header`` (module doc); ``payload``: the bytes after it."""
    spans = sorted(
        (_tensor_bytes(name, entry, pointer, where), name)
        for name, entry in header.items()
        if name != "__metadata__"
    )
    end = 0
    for (begin, stop), name in spans:
        if begin != end:
            raise SpecError(
                pointer,
                f"{where}: tensor {name[:80]!r} starts at byte {begin:,} of the data, "
                f"expected {end:,} (the ranges must follow each other without gaps)",
            )
        end = stop
    if end != payload:
        raise SpecError(
            pointer,
            f"{where}: the tensors cover {end:,} bytes, the file holds {payload:,} after "
            "its header",
        )


def read_header(file: Path, pointer: str, where: str, max_header: int) -> dict[str, Any]:
    """The header of the safetensors ``file`` with every tensor checked (:func:`check_tensors`),
    read without loading any tensor: an 8-byte little-endian length, then at most
    ``max_header`` bytes of JSON nested at most ``json_limits.MAX_DEPTH`` levels."""
    size = file.stat().st_size
    with file.open("rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 2 <= n <= min(max_header, size - 8):
            raise SpecError(
                pointer,
                f"{where} is not a safetensors file (header length {n} in a file of {size} bytes)",
            )
        raw = fh.read(n)
    try:
        header: Any = json_limits.loads(raw)
    except ValueError as err:  # not JSON, not UTF-8, or nested deeper than MAX_DEPTH
        raise SpecError(pointer, f"{where} is not a safetensors file (bad header: {err})") from None
    if not isinstance(header, dict):
        raise SpecError(pointer, f"{where} is not a safetensors file (bad header)")
    check_tensors(header, size - 8 - n, pointer, where)
    return header


def _vocabulary(model: Any) -> set[str] | None:
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):  # WordPiece, WordLevel, BPE
        return set(vocab)
    if isinstance(vocab, list):  # Unigram: [[token, score], ...]
        return {v[0] for v in vocab if isinstance(v, list) and v and isinstance(v[0], str)}
    return None


def check_tokenizer(file: Path, pointer: str, where: str, *, bert_tokens: bool = True) -> None:
    """``tokenizer.json`` as the module doc says; ``where``: its name for messages;
    ``bert_tokens``: whether BERT's special tokens are required."""
    if file.stat().st_size > MAX_TOKENIZER_BYTES:
        raise SpecError(pointer, f"{where} is larger than {MAX_TOKENIZER_BYTES:,} bytes")
    try:
        data = json_limits.loads(file.read_bytes())
    except ValueError as err:  # not JSON, not UTF-8, or nested deeper than MAX_DEPTH
        raise SpecError(pointer, f"{where} is not a tokenizer (not valid JSON: {err})") from None
    vocab = _vocabulary(data.get("model")) if isinstance(data, dict) else None
    if vocab is None:
        raise SpecError(pointer, f"{where} is not a tokenizer (no model with a vocabulary)")
    added = data.get("added_tokens")
    for token in added if isinstance(added, list) else []:
        if isinstance(token, dict) and isinstance(token.get("content"), str):
            vocab.add(token["content"])
    if bert_tokens and (missing := [t for t in SPECIAL_TOKENS if t not in vocab]):
        raise SpecError(pointer, f"{where} lacks the special tokens {missing} of BERT inputs")
