"""Offline scoring: HugeCTR's Python inference API on hps-triton's engine.

HugeCTR users score datasets with ``hugectr.inference.InferenceModel`` and debug models with
``check_out_tensor``. Here:

=================================================  ============================================
HugeCTR                                            hps-triton
=================================================  ============================================
``InferenceModel(network, InferenceParams(...))``  :meth:`InferenceModel.from_files` (network,
                                                   dense file, sparse folders) or
                                                   :meth:`InferenceModel.from_ps_json`
``max_batchsize``, ``device_id``                   ``max_batch_size``, ``device_id`` (None: CPU)
``use_mixed_precision``                            ``precision="fp16"`` (also ``"tf32"``)
``predict(dense, embeddingcolumns, row_ptrs)``     :meth:`InferenceModel.predict` (same arrays)
``predict(num_batches, source, Parquet, ...)``     :meth:`InferenceModel.predict_dataset` (a
                                                   file, folder or ``_file_list.txt``, whole)
``evaluate(...)`` (AUC)                            :meth:`InferenceModel.evaluate`
``check_out_tensor(name, Tensor_t)``               :meth:`InferenceModel.check_out_tensor` (the
                                                   last batch; any layer's output by name)
=================================================  ============================================

On the command line: ``hps predict PS_JSON DATASET --out FILE``.
"""

from hps_core.offline.dataset import DatasetColumns, dataset_columns, dataset_files, iter_dataset
from hps_core.offline.metrics import auc
from hps_core.offline.model import DatasetPredictions, InferenceModel, write_predictions

__all__ = [
    "DatasetColumns",
    "DatasetPredictions",
    "InferenceModel",
    "auc",
    "dataset_columns",
    "dataset_files",
    "iter_dataset",
    "write_predictions",
]
