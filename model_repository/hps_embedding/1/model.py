"""Triton entry point: HugeCTR's `hps` lookup contract (KEYS, NUMKEYS -> OUTPUT0)."""

from triton_backend.embedding_model import EmbeddingModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
