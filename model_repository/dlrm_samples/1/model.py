"""Triton entry point: one sample per batch row (dense, sparse -> score)."""

from triton_backend.ranking_model import SamplesRankingModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
