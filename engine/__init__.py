"""CoMERA engine: tensor-train layers with rank gates, contraction planning, compression.

Public API (one screen)::

    TTLinear, TTMEmbedding          tensorized modules (engine.nn)
    compress_, CompressConfig,      swap nn.Linear / nn.Embedding in any model
    LayerOverride, CompressionSummary
    factorize                       balanced mode factorization with padding
    tt_svd, tt_round                TT decomposition and rounding
    plan_tt_linear, TTLinearProblem contraction planner and its cost model
    build_transformer, TransformerConfig   the paper's six-encoder reference model
"""

from engine.compress import CompressConfig, CompressionSummary, LayerOverride, compress_
from engine.contract.plan import TTLinearProblem, plan_tt_linear
from engine.models.transformer import TransformerConfig, build_transformer
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.tt.decompose import tt_round, tt_svd
from engine.tt.shapes import factorize

__version__ = "0.1.0"

__all__ = [
    "TTLinear",
    "TTMEmbedding",
    "compress_",
    "CompressConfig",
    "LayerOverride",
    "CompressionSummary",
    "factorize",
    "tt_svd",
    "tt_round",
    "plan_tt_linear",
    "TTLinearProblem",
    "build_transformer",
    "TransformerConfig",
    "__version__",
]
