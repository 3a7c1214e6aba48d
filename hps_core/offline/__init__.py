"""Offline scoring: HugeCTR's Python inference API on hps-triton's engine.

HugeCTR users score datasets with ``hugectr.inference.InferenceModel`` and
``CreateInferenceSession`` and debug models with ``check_out_tensor``. The same names are here,
with HugeCTR v24.06's arguments, so a HugeCTR script runs with its imports changed only
(``import hps_core.offline as hugectr``; ``from hps_core.offline.inference import ...`` or
``from hps_core.offline import ...``):

=================================================  ============================================
HugeCTR                                            hps-triton
=================================================  ============================================
``InferenceParams(model_name, max_batchsize,       :class:`InferenceParams` (same fields, order
hit_rate_threshold, ...)``                         and defaults; inert ones warn)
``InferenceModel(model_config_path, params)``      :class:`InferenceModel` (also
                                                   :meth:`InferenceModel.from_ps_json`,
                                                   :meth:`InferenceModel.from_files`)
``CreateInferenceSession(model_config_path,        :func:`CreateInferenceSession`
params)``
``session.predict(dense_feature,                   :meth:`InferenceSession.predict` (a list of
embeddingcolumns, row_ptrs)``                      floats, as HugeCTR)
``model.predict(num_batches, source,               :meth:`InferenceModel.predict` (Parquet;
DataReaderType_t.Parquet, Check_t.Non, ...)``      ``[max_batchsize * num_batches, label_dim]``)
``evaluate(num_batches, source, ...)`` (AUC)       :meth:`InferenceModel.evaluate` (or the whole
                                                   dataset: ``evaluate(source)``)
``check_out_tensor(name)``                         :meth:`InferenceModel.check_out_tensor` (the
                                                   last batch; any layer's output by name)
``VolatileDatabaseParams``, ``DatabaseType_t``...  the same names (:mod:`.params`)
=================================================  ============================================

Beyond HugeCTR: ``device_id=None`` scores on the CPU (and a ``device_id`` on a machine without
a GPU does, with a warning); :meth:`InferenceModel.predict_dataset` scores a whole dataset.
On the command line: ``hps predict PS_JSON DATASET --out FILE``.
"""

from hps_core.offline import inference
from hps_core.offline.dataset import DatasetColumns, dataset_columns, dataset_files, iter_dataset
from hps_core.offline.metrics import auc
from hps_core.offline.model import DatasetPredictions, InferenceModel, write_predictions
from hps_core.offline.params import (
    Check_t,
    DatabaseOverflowPolicy_t,
    DatabaseType_t,
    DataReaderType_t,
    EmbeddingCacheType_t,
    InferenceParams,
    PersistentDatabaseParams,
    UpdateSourceParams,
    UpdateSourceType_t,
    VolatileDatabaseParams,
)
from hps_core.offline.session import CreateInferenceSession, InferenceSession

__all__ = [
    "Check_t",
    "CreateInferenceSession",
    "DataReaderType_t",
    "DatabaseOverflowPolicy_t",
    "DatabaseType_t",
    "DatasetColumns",
    "DatasetPredictions",
    "EmbeddingCacheType_t",
    "InferenceModel",
    "InferenceParams",
    "InferenceSession",
    "PersistentDatabaseParams",
    "UpdateSourceParams",
    "UpdateSourceType_t",
    "VolatileDatabaseParams",
    "auc",
    "dataset_columns",
    "dataset_files",
    "inference",
    "iter_dataset",
    "write_predictions",
]
