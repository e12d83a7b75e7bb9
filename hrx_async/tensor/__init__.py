"""Tensor operations recorded as GPU work: row gather, finite check, bf16 linear."""

from .ops import TensorOps

__all__ = ["TensorOps"]
