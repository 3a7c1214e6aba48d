"""Triton entry point: HugeCTR's `hugectr` contract (DES, CATCOLUMN, ROWINDEX -> OUTPUT0)."""

from triton_backend.ranking_model import HugeCTRRankingModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
