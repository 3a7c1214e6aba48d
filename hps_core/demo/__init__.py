"""Deterministic demo models for the default model repository.

``DEMO_MODELS`` maps a model folder name to the function that writes it (config.pbtxt,
model.py, ps.json and its data files) into a repository. Generated data is a function of the
seed only, so every machine serves the same vectors and predictions. The ranking models
(``dlrm``, ``dcn``, ``wdl``) also write their ``<name>_samples`` twin. ``ZOO_MODELS``
holds one model of each other family of HugeCTR's samples (DLRM with fused MLP layers, DIN,
BST, MMoE, NCF), written on demand (``hps prepare --zoo``).
"""

import functools

from hps_core.demo.dlrm import write_dlrm_demo
from hps_core.demo.embedding import write_embedding_demo
from hps_core.demo.ranking import ZOO, write_dcn_demo, write_ranking_demo, write_wdl_demo

DEMO_MODELS = {
    "hps_embedding": write_embedding_demo,
    "dlrm": write_dlrm_demo,
    "dcn": write_dcn_demo,
    "wdl": write_wdl_demo,
}

ZOO_MODELS = {demo.name: functools.partial(write_ranking_demo, demo) for demo in ZOO}
"""HugeCTR's other sample families, written by ``hps prepare --zoo``."""

__all__ = [
    "DEMO_MODELS",
    "ZOO_MODELS",
    "write_dcn_demo",
    "write_dlrm_demo",
    "write_embedding_demo",
    "write_wdl_demo",
]
