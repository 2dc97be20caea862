"""CoMERA engine: tensor-train layers with rank gates, contraction planning, compression.

Public API (one screen)::

    TTLinear, TTMEmbedding          tensorized modules (engine.nn)
    compress_, CompressConfig,      swap nn.Linear / nn.Embedding in any model
    LayerOverride, CompressionSummary
    factorize                       balanced mode factorization with padding
    tt_svd, tt_round                TT decomposition and rounding
    plan_tt_linear, TTLinearProblem contraction planner and its cost model
    build_transformer, TransformerConfig   the paper's six-encoder reference model
    build_model, TensorizeOptions   any registered workload (transformer, dlrm, mlm, mlp)
    JobConfig, Trainer              one training job: stage schedule, checkpoints, callbacks
    GateIndex, model_size           rank penalty and the exact size model S
    export_compressed, load_compressed, densify   compressed checkpoints
"""

from engine.compress import CompressConfig, CompressionSummary, LayerOverride, compress_
from engine.contract.plan import TTLinearProblem, plan_tt_linear
from engine.export import densify, export_compressed, load_compressed
from engine.models.registry import TensorizeOptions, build_model
from engine.models.transformer import TransformerConfig, build_transformer
from engine.nn.tt_linear import TTLinear
from engine.nn.ttm_embedding import TTMEmbedding
from engine.rank import GateIndex, model_size
from engine.train import JobConfig, Trainer
from engine.tt.decompose import tt_round, tt_svd
from engine.tt.shapes import factorize
from engine.version import __version__

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
    "build_model",
    "TensorizeOptions",
    "JobConfig",
    "Trainer",
    "GateIndex",
    "model_size",
    "export_compressed",
    "load_compressed",
    "densify",
    "__version__",
]
