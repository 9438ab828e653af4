"""Analyses of the IR: functions that read a module or function and return facts about it,
rewriting nothing (the passes that rewrite are in byoc/transform)."""
from .liveness import Lifetime, analyze_liveness, is_view_call, tensor_bytes

__all__ = ["Lifetime", "analyze_liveness", "is_view_call", "tensor_bytes"]
