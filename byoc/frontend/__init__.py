"""Frontends: turn a model from another format into a typed IRModule with static shapes.
Today: ONNX (`from_onnx`)."""
from .onnx import from_onnx, SUPPORTED_OPS

__all__ = ["from_onnx", "SUPPORTED_OPS"]
