"""The inputs and outputs of each request contract, declared once.

A contract's tensors (name, data type, dims, ragged batching) are written here and nowhere
else: :mod:`hps_core.triton_repo` writes them into config.pbtxt, the Triton models check the
config.pbtxt they are loaded with against them (``triton_backend/model_settings.check_io``)
and read requests by them. What the values mean is the contracts' business:
:mod:`hps_core.infer.contracts` (``hugectr`` and samples) and ``triton_backend/hps_contract.py``
(HugeCTR's ``hps`` embedding lookup).

Example:
    >>> [t.name for t in HUGECTR_IO.inputs]
    ['DES', 'CATCOLUMN', 'ROWINDEX']
    >>> samples_io(dense_dim=13, sample_width=26, label_dim=1).inputs[1]
    TensorSpec(name='sparse', dtype=<class 'numpy.int64'>, dims=(26,), ragged=False)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

KEYS = "KEYS"
NUMKEYS = "NUMKEYS"
OUTPUT0 = "OUTPUT0"

DES = "DES"
CATCOLUMN = "CATCOLUMN"
ROWINDEX = "ROWINDEX"

DENSE = "dense"
SPARSE = "sparse"
SCORE = "score"

# config.pbtxt parameters the models read (``triton_backend/model_settings.py``,
# ``lookup_service.py``) and :mod:`hps_core.triton_repo` writes, by their names there.
PS_JSON_PARAMETER = "ps_json"
SOURCE_PS_JSON_PARAMETER = "source_ps_json"
"""The user's ps.json that the model's ps.json was written from (a HugeCTR repository's
translation, :mod:`hps_core.hugectr_repo`): what the model's load log and errors name."""
HPS_MODEL_PARAMETER = "hps_model_name"
MISS_POLICY_PARAMETER = "async_miss_policy"
HOT_KEYS_PARAMETER = "hot_keys"
SHARE_CACHE_PARAMETER = "share_gpu_cache"
FREEZE_SPARSE_PARAMETER = "freeze_sparse"
"""HugeCTR's hps backend's: a new version does not re-read the sparse files (its tables stay
as the online updates left them)."""
PRECISION_PARAMETER = "precision"
KAFKA_OPTIONS_PARAMETER = "update_kafka_options"
REPLAY_PARAMETER = "update_replay"

_TRITON_TYPES = {
    np.dtype(np.float32): "TYPE_FP32",
    np.dtype(np.int32): "TYPE_INT32",
    np.dtype(np.uint32): "TYPE_UINT32",
    np.dtype(np.int64): "TYPE_INT64",
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a contract.

    Args:
        name: the tensor's name in requests and config.pbtxt.
        dtype: its NumPy dtype (``np.float32``, ``np.int32``, ``np.uint32`` or ``np.int64``).
        dims: its dims without Triton's batch dimension (``-1``: any length).
        ragged: requests of different lengths may be batched (``allow_ragged_batch``).
    """

    name: str
    dtype: type
    dims: tuple[int, ...]
    ragged: bool = False

    @property
    def data_type(self) -> str:
        """Triton's name of the dtype, e.g. ``"TYPE_INT64"``."""
        return _TRITON_TYPES[np.dtype(self.dtype)]


@dataclass(frozen=True)
class ModelIO:
    """The tensors of a contract.

    Args:
        inputs: what a request carries, in order.
        outputs: what a response carries.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


EMBEDDING_IO = ModelIO(
    inputs=(
        TensorSpec(KEYS, np.int64, (-1,), ragged=True),
        TensorSpec(NUMKEYS, np.int32, (-1,), ragged=True),
    ),
    outputs=(TensorSpec(OUTPUT0, np.float32, (-1,)),),
)
"""HugeCTR's ``hps`` backend: every table's keys, each table's key count -> the vectors."""

EMBEDDING_IO_UNBATCHED = ModelIO(
    inputs=(TensorSpec(KEYS, np.int64, (-1, -1)), TensorSpec(NUMKEYS, np.int32, (-1, -1))),
    outputs=(TensorSpec(OUTPUT0, np.float32, (-1,)),),
)
"""The same for a model with ``max_batch_size: 0`` (HugeCTR's HPS ensemble samples): a
request's tensors whole, ``KEYS`` of any shape (read flat), ``NUMKEYS`` ``[1, T]`` ->
``OUTPUT0`` ``[sum N_t * dim_t]``, as HugeCTR's backend answers."""

HUGECTR_IO = ModelIO(
    inputs=(
        TensorSpec(DES, np.float32, (-1,), ragged=True),
        TensorSpec(CATCOLUMN, np.int64, (-1,), ragged=True),
        TensorSpec(ROWINDEX, np.int32, (-1,), ragged=True),
    ),
    outputs=(TensorSpec(OUTPUT0, np.float32, (-1,)),),
)
"""HugeCTR's ``hugectr`` backend: one request's samples flattened (dense features, keys, CSR
row offsets per table) -> their scores."""


def hugectr_io(long_keys: bool = True) -> ModelIO:
    """The ``hugectr`` contract of a model whose keys are 64-bit (``supportlonglong``, INT64
    ``CATCOLUMN``: :data:`HUGECTR_IO`) or 32-bit (UINT32 ``CATCOLUMN``, as HugeCTR's backend
    reads them then).

    Example:
        >>> hugectr_io(long_keys=False).inputs[1].data_type
        'TYPE_UINT32'
    """
    if long_keys:
        return HUGECTR_IO
    des, catcolumn, rowindex = HUGECTR_IO.inputs
    return ModelIO((des, replace(catcolumn, dtype=np.uint32), rowindex), HUGECTR_IO.outputs)


def samples_io(dense_dim: int, sample_width: int, label_dim: int) -> ModelIO:
    """The samples contract of a model: Triton's batch dimension is the sample.

    Args:
        dense_dim: dense features per sample.
        sample_width: keys per sample, every table's (``RankingLayout.sample_width``).
        label_dim: scores per sample.

    Returns:
        ``dense`` FP32 ``[D]``, ``sparse`` INT64 ``[K]`` -> ``score`` FP32 ``[label_dim]``.
    """
    return ModelIO(
        inputs=(
            TensorSpec(DENSE, np.float32, (dense_dim,)),
            TensorSpec(SPARSE, np.int64, (sample_width,)),
        ),
        outputs=(TensorSpec(SCORE, np.float32, (label_dim,)),),
    )
