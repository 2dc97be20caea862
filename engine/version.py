"""The engine's version, written into checkpoints and exports (a leaf: imports nothing)."""

__version__ = "0.1.0"
