"""The names of HugeCTR's ``hugectr.inference`` module, so a HugeCTR offline-inference
script runs with its imports changed only::

    import hugectr                         ->  import hps_core.offline as hugectr
    from hugectr.inference import ...      ->  from hps_core.offline.inference import ...

``hps_core.offline`` has the same names (and ``hps_core.offline.inference`` is this module);
``HPS`` is :class:`hps_core.HPS` (HugeCTR's ``HPS(ps_config_file).lookup(keys, model_name,
table_id)``; ``device_id`` defaults to the host here, to GPU 0 in HugeCTR).
"""

from hps_core.hps import HPS
from hps_core.offline.model import InferenceModel
from hps_core.offline.params import (
    EmbeddingCacheType_t,
    InferenceParams,
    PersistentDatabaseParams,
    UpdateSourceParams,
    VolatileDatabaseParams,
)
from hps_core.offline.session import CreateInferenceSession, InferenceSession

__all__ = [
    "HPS",
    "CreateInferenceSession",
    "EmbeddingCacheType_t",
    "InferenceModel",
    "InferenceParams",
    "InferenceSession",
    "PersistentDatabaseParams",
    "UpdateSourceParams",
    "VolatileDatabaseParams",
]
