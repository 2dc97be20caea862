"""What a deployer asks of a compressed model, measured beside the original."""

from engine.measure.deploy import compare_deploy, peak_tensor_bytes, time_forward

__all__ = ["compare_deploy", "peak_tensor_bytes", "time_forward"]
