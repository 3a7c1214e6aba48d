"""Ranking-model sessions: samples -> embedding lookup -> pooling -> dense network -> scores.

- :mod:`~hps_core.infer.inputs`: what a ranking model takes:

  - :mod:`~hps_core.infer.inputs.layout`: which ps.json table feeds which embedding layer,
    checked.
  - :mod:`~hps_core.infer.inputs.batch`: samples in CSR form, joined across requests.

- :mod:`~hps_core.infer.session`: the lookup and forward pass of one model; on a GPU through
  :mod:`~hps_core.infer.gpu`, which imports ``inputs`` but nothing else of this package.

Example::

    session = RankingSession.open("model_repository/dlrm/ps.json", "dlrm")
    scores = session.predict(batch)          # float32 [batch, label_dim]
"""

from hps_core.infer.inputs.batch import SparseBatch, concat_batches, split_samples
from hps_core.infer.inputs.layout import (
    RankingLayout,
    TableFeed,
    is_ranking_model,
    load_ranking_graph,
)
from hps_core.infer.session import EmbeddingSource, RankingSession

__all__ = [
    "EmbeddingSource",
    "RankingLayout",
    "RankingSession",
    "SparseBatch",
    "TableFeed",
    "concat_batches",
    "is_ranking_model",
    "load_ranking_graph",
    "split_samples",
]
