"""Upper bounds on every size a model config may ask for.

Generous but finite: the largest model each architecture may describe stays buildable on one
worker (BERT-large is 335 M parameters, Criteo Kaggle's DLRM 540 M). The service's wire schema
states the same bounds (``api_schemas.model_limits``), and a test checks that the two agree.
"""

from __future__ import annotations

__all__ = [
    "MAX_CLASSES",
    "MAX_EMBEDDING_DIM",
    "MAX_FF",
    "MAX_HEADS",
    "MAX_HIDDEN_LAYERS",
    "MAX_IN_FEATURES",
    "MAX_LAYERS",
    "MAX_LEN",
    "MAX_TABLES",
    "MAX_TABLE_ROWS",
    "MAX_TYPE_VOCAB",
    "MAX_VOCAB",
    "MAX_WIDTH",
]

MAX_VOCAB = 1 << 20
MAX_WIDTH = 16_384
MAX_FF = 65_536
MAX_HEADS = 256
MAX_LAYERS = 48
MAX_LEN = 8192
MAX_TYPE_VOCAB = 64
MAX_CLASSES = 65_536
MAX_IN_FEATURES = 1 << 20
MAX_HIDDEN_LAYERS = 32  # entries of a list of hidden widths
MAX_EMBEDDING_DIM = 4096
MAX_TABLES = 64
MAX_TABLE_ROWS = 100_000_000  # Criteo Kaggle's largest table has 10.1 M rows
