"""The request contract of HugeCTR's ``hps`` Triton backend, validated and batched.

One request carries the keys of every table of a model:

- ``KEYS`` INT64 ``[1, sum N_t]``: the keys of table 0, then of table 1, ...
- ``NUMKEYS`` INT32 ``[1, T]``: ``N_t``, the number of keys of each table.
- ``OUTPUT0`` FP32 ``[1, sum N_t * dim_t]``: the vectors in the same order, flattened.

Example with two tables of dims 2 and 3, keys ``[5, 9]`` for table 0 and ``[7]`` for table 1:
``KEYS = [[5, 9, 7]]``, ``NUMKEYS = [[2, 1]]``, ``OUTPUT0 = [[e5_0, e5_1, e9_0, e9_1, f7_0,
f7_1, f7_2]]``.

Everything here is plain array code (NumPy, or CuPy for keys that arrive on a GPU), so it is
tested without a Triton server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hps_core.arrays import module_of, to_host
from hps_core.config import ModelConfig
from hps_core.errors import RequestError
from hps_core.infer.model_io import KEYS, NUMKEYS
from hps_core.wording import plural


def _shape(array: np.ndarray) -> str:
    return "[" + ", ".join(str(d) for d in array.shape) + "]"


def _one_row(name: str, array: np.ndarray) -> np.ndarray:
    # [1, N] with Triton's batch dimension, or [N] for a model configured without batching.
    if array.ndim == 2 and array.shape[0] == 1:
        return array[0]
    if array.ndim == 1:
        return array
    raise RequestError(
        f"input '{name}': expected shape [1, N] (one key set per request), got {_shape(array)}"
    )


@dataclass(frozen=True)
class HpsContract:
    """What one model accepts: its tables' dims and per-request key limits.

    Args:
        dims: embedding vector size of each table.
        max_keys: most keys one request may send for each table (HugeCTR:
            ``max_batch_size * maxnum_catfeature_query_per_table_per_sample``).
    """

    dims: tuple[int, ...]
    max_keys: tuple[int, ...]

    @classmethod
    def from_model(cls, model: ModelConfig) -> HpsContract:
        """The contract of a ps.json model.

        Args:
            model: the model's configuration.

        Returns:
            Its contract.
        """
        return cls(
            dims=tuple(t.dim for t in model.tables),
            max_keys=tuple(model.max_batch_size * t.max_query_per_sample for t in model.tables),
        )

    @property
    def num_tables(self) -> int:
        """Number of tables."""
        return len(self.dims)

    def parse(
        self, keys: np.ndarray, numkeys: np.ndarray, batched: bool = True
    ) -> list[np.ndarray]:
        """Validate one request and split its keys per table.

        Args:
            keys: the ``KEYS`` input as received.
            numkeys: the ``NUMKEYS`` input as received.
            batched: the model batches requests (``[1, N]`` rows); ``False``
                (``max_batch_size: 0``): tensors of any shape, read flat, as HugeCTR's
                backend reads their bytes.

        Returns:
            One int64 key array per table.

        Raises:
            RequestError: naming the input and what is wrong with it.
        """
        if keys.dtype != np.int64:
            raise RequestError(f"input '{KEYS}': expected INT64, got {keys.dtype}")
        if numkeys.dtype != np.int32:
            raise RequestError(f"input '{NUMKEYS}': expected INT32, got {numkeys.dtype}")
        if batched:
            flat_keys, counts = _one_row(KEYS, keys), _one_row(NUMKEYS, numkeys)
        else:
            flat_keys, counts = keys.reshape(-1), numkeys.reshape(-1)
        counts = to_host(counts).astype(np.int64)
        if len(counts) != self.num_tables:
            raise RequestError(
                f"input '{NUMKEYS}': expected {self.num_tables} counts (one per table), "
                f"got {len(counts)}"
            )
        if (counts < 0).any():
            bad = int(np.flatnonzero(counts < 0)[0])
            raise RequestError(
                f"input '{NUMKEYS}': count of table {bad} is negative ({counts[bad]})"
            )
        if len(flat_keys) == 0:
            raise RequestError(f"input '{KEYS}': empty, a request must carry at least one key")
        if int(counts.sum()) != len(flat_keys):
            raise RequestError(
                f"input '{NUMKEYS}': counts sum to {int(counts.sum())} but '{KEYS}' holds "
                f"{plural(len(flat_keys), 'key')}"
            )
        over = np.flatnonzero(counts > np.asarray(self.max_keys))
        if over.size:
            t = int(over[0])
            raise RequestError(
                f"input '{NUMKEYS}': table {t} has {counts[t]} keys, more than the "
                f"{self.max_keys[t]} allowed (max_batch_size x "
                "maxnum_catfeature_query_per_table_per_sample)"
            )
        bounds = np.concatenate([[0], np.cumsum(counts)])
        # Slices, not np.split: the keys may be a CuPy array when they arrive on the GPU.
        return [flat_keys[bounds[t] : bounds[t + 1]] for t in range(self.num_tables)]

    def output_length(self, counts: Sequence[int]) -> int:
        """Length of ``OUTPUT0`` for a request with ``counts`` keys per table."""
        return int(sum(n * d for n, d in zip(counts, self.dims, strict=True)))


def batch_tables(requests_keys: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """Concatenate the keys of several requests, table by table.

    Args:
        requests_keys: per request, one key array per table.

    Returns:
        One key array per table holding every request's keys in request order.
    """
    return [module_of(keys[0]).concatenate(keys) for keys in zip(*requests_keys, strict=True)]


def split_outputs(
    values_per_table: Sequence[np.ndarray], requests_keys: Sequence[Sequence[np.ndarray]]
) -> list[np.ndarray]:
    """Cut batched vectors back into one flat ``OUTPUT0`` row per request.

    Args:
        values_per_table: per table, float32 ``[sum over requests of n_t, dim_t]``.
        requests_keys: per request, the key arrays that were batched.

    Returns:
        Per request a C-contiguous float32 ``[1, sum n_t * dim_t]`` array (NumPy or CuPy,
        as the values).
    """
    offsets = [0] * len(values_per_table)
    xp = module_of(values_per_table[0]) if values_per_table else np
    outputs = []
    for keys in requests_keys:
        parts = []
        for t, table_keys in enumerate(keys):
            n = len(table_keys)
            parts.append(values_per_table[t][offsets[t] : offsets[t] + n].ravel())
            offsets[t] += n
        outputs.append(xp.concatenate(parts)[None, :])
    return outputs
