"""Deterministic demo models for the default model repository.

``DEMO_MODELS`` maps a model folder name to the function that writes it (config.pbtxt,
model.py, ps.json and its data files) into a repository. Generated data is a function of the
seed only, so every machine serves the same vectors.
"""

from hps_core.demo.embedding import write_embedding_demo

DEMO_MODELS = {"hps_embedding": write_embedding_demo}

__all__ = ["DEMO_MODELS", "write_embedding_demo"]
