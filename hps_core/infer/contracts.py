"""Request contracts of ranking models (HugeCTR's ``hugectr`` backend and fixed-hotness samples),
validated and turned into a :class:`SparseBatch`; the Triton models and the offline API
(:mod:`hps_core.offline`) share them.

Two contracts serve the same model files (plain NumPy here, so they are tested without a
server):

**HugeCTR's ``hugectr`` backend** (:class:`HugeCTRContract`), as its ``src/hugectr.cc`` and
HugeCTR's ``InferenceSession::predict`` (v24.06) lay it out. With ``T`` tables, ``S_t`` slots
in table ``t``, ``S = sum S_t`` and ``D`` dense features, one request carries ``B`` samples:

- ``DES`` FP32 ``[1, B * D]``: the dense features, sample by sample.
- ``ROWINDEX`` INT32 ``[1, B * S + T]``: one CSR offset array per table, concatenated in table
  order; table ``t``'s array has ``B * S_t + 1`` entries over its (sample, slot) pairs,
  sample-major, starts at 0 and ends at the number of keys of that table. The backend derives
  ``B = (len(ROWINDEX) - T) / S`` from it, then requires ``len(DES) = B * D``.
- ``CATCOLUMN`` INT64 ``[1, nnz]``: the keys, **sample-major**: sample 0's keys of table 0
  (slot by slot), then sample 0's keys of table 1, ..., then sample 1. HugeCTR's ``predict``
  takes this layout by default (``table_major_key_layout = false``) and regroups the keys per
  table with ``distribute_keys_per_table``; with one table both layouts are the same.
- ``OUTPUT0`` FP32 ``[1, B * label_dim]``: the predictions, sample by sample.

Example, two tables (2 and 1 slots), ``B = 2``, sample 0 = ``{t0: [[5], [6, 7]], t1: [[9]]}``,
sample 1 = ``{t0: [[], [8]], t1: [[4]]}``: ``CATCOLUMN = [5, 6, 7, 9, 8, 4]``,
``ROWINDEX = [0, 1, 3, 3, 4,  0, 1, 2]``.

Where this differs from HugeCTR's backend, on purpose: offsets are checked (start at 0, never
decrease, end where ``CATCOLUMN`` ends) instead of trusted; every error is ``INVALID_ARG``
naming the input (HugeCTR answers ``UNSUPPORTED`` or reads out of bounds); ``OUTPUT0`` has
``B * label_dim`` values (HugeCTR copies ``B`` whatever ``label_dim`` is) and keeps Triton's
batch dimension (HugeCTR returns ``[B * label_dim]``) because the model batches requests.
Keys are INT64, or UINT32 for a model with ``supportlonglong: false``, as in HugeCTR.

**Samples** (:class:`SamplesContract`), for models with a fixed number of keys per slot and
Triton's batching: Triton's batch dimension is the sample.

- ``dense`` FP32 ``[B, D]``, ``sparse`` INT64 ``[B, K]``: ``h_t`` keys per slot, tables in
  order, slots in order within a table, a slot's keys in order (the same order as
  ``CATCOLUMN``), with ``h_t`` the ``nnz_per_slot`` of a table whose sparse input is
  ``is_fixed_length`` in the network file (MLPerf DLRM-v2's multi-hot tables) and 1 otherwise
  (one key per slot), so ``K = sum_t S_t * h_t``.
- ``score`` FP32 ``[B, label_dim]``.

So ``perf_analyzer -b 8`` sends 8 samples in one request and the dynamic batcher may join
requests up to ``max_batch_size`` samples.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hps_core.errors import RequestError
from hps_core.infer.inputs.batch import SparseBatch
from hps_core.infer.inputs.layout import RankingLayout
from hps_core.infer.model_io import (  # the tensors' names, declared with them there
    CATCOLUMN,
    DENSE,
    DES,
    ROWINDEX,
    SPARSE,
)


def _shape(array: np.ndarray) -> str:
    return "[" + ", ".join(str(d) for d in array.shape) + "]"


def _input(name: str) -> str:
    return f"input '{name}'"


def _check_dtype(label: str, array: np.ndarray, dtype: type) -> None:
    if array.dtype != dtype:
        raise RequestError(f"{label}: expected {np.dtype(dtype).name}, got {array.dtype}")


def _flat_row(label: str, array: np.ndarray) -> np.ndarray:
    # [1, N] with Triton's batch dimension, or [N] for a model configured without batching.
    if array.ndim == 2 and array.shape[0] == 1:
        return array[0]
    if array.ndim == 1:
        return array
    raise RequestError(
        f"{label}: expected shape [1, N] (one request's samples flattened), got {_shape(array)}"
    )


def _check_finite(label: str, dense: np.ndarray, width: int) -> None:
    """Refuse a NaN or infinite dense feature: it would turn its sample's score into NaN
    silently (and warn in the server's log without naming the request)."""
    finite = np.isfinite(dense)
    if not finite.all():
        first = int(np.flatnonzero(~finite.ravel())[0])
        raise RequestError(
            f"{label}: sample {first // width}, dense feature {first % width} is "
            f"{dense.ravel()[first]}; dense features must be finite numbers"
        )


def _check_batch_size(label: str, batch: int, layout: RankingLayout) -> None:
    if batch < 1:
        raise RequestError(f"{label}: a request must carry at least one sample")
    if batch > layout.max_batch_size:
        raise RequestError(
            f"{label}: {batch} samples, more than the {layout.max_batch_size} allowed "
            f"(max_batch_size of model '{layout.model}' in ps.json)"
        )


@dataclass(frozen=True)
class ArrayNames:
    """What errors call the three arrays of :class:`HugeCTRContract`: Triton's inputs (the
    default), or the arguments of a Python call that takes the same arrays
    (:mod:`hps_core.offline`), so a message names what its reader passed.

    Args:
        dense: the dense features (``DES``).
        keys: the keys (``CATCOLUMN``).
        row_ptrs: the row offsets (``ROWINDEX``).
        kind: ``"input"`` (a Triton input) or ``"argument"`` (a Python argument).

    Example:
        >>> ArrayNames("dense", "keys", "row_ptrs", kind="argument").label("row_ptrs")
        "argument 'row_ptrs'"
    """

    dense: str = DES
    keys: str = CATCOLUMN
    row_ptrs: str = ROWINDEX
    kind: str = "input"

    def label(self, name: str) -> str:
        """How a message starts that is about array ``name``."""
        return f"{self.kind} '{name}'"


@dataclass(frozen=True)
class HugeCTRContract:
    """``DES``, ``CATCOLUMN``, ``ROWINDEX`` -> ``OUTPUT0`` (see the module docstring).

    Args:
        layout: the model's tables, slots and widths.
        key_dtype: ``CATCOLUMN``'s dtype: ``np.int64``, or ``np.uint32`` for a model with
            32-bit keys (``supportlonglong: false``).
        names: what errors call the arrays (default: the Triton inputs).
    """

    layout: RankingLayout
    key_dtype: type = np.int64
    names: ArrayNames = ArrayNames()

    def parse(self, des: np.ndarray, catcolumn: np.ndarray, rowindex: np.ndarray) -> SparseBatch:
        """Validate one request and regroup its keys per table.

        Args:
            des: the ``DES`` input as received.
            catcolumn: the ``CATCOLUMN`` input as received.
            rowindex: the ``ROWINDEX`` input as received.

        Returns:
            The request's samples.

        Raises:
            RequestError: naming the input and what is wrong with it.
        """
        n = self.names
        _check_dtype(n.label(n.dense), des, np.float32)
        _check_dtype(n.label(n.keys), catcolumn, self.key_dtype)
        _check_dtype(n.label(n.row_ptrs), rowindex, np.int32)
        dense = _flat_row(n.label(n.dense), des)
        keys = _flat_row(n.label(n.keys), catcolumn).astype(np.int64, copy=False)
        rows = _flat_row(n.label(n.row_ptrs), rowindex)
        batch = self._batch_size(len(rows))
        layout = self.layout
        if len(dense) != batch * layout.dense_dim:
            raise RequestError(
                f"{n.label(n.dense)}: '{n.row_ptrs}' describes {batch} samples of "
                f"{layout.dense_dim} dense features, so {batch * layout.dense_dim} values are "
                f"expected, got {len(dense)}"
            )
        _check_finite(n.label(n.dense), dense, layout.dense_dim)
        fixed = self._fixed_hotness_batch(dense, keys, rows, batch)
        if fixed is not None:
            return fixed
        offsets = self._table_offsets(rows, batch)
        ends = [int(o[-1]) for o in offsets]
        if sum(ends) != len(keys):
            per_table = "; ".join(
                f"{_tables(first, last)}: {end}{'' if first == last else ' each'}"
                for first, last, end in _runs(ends)
            )
            raise RequestError(
                f"{n.label(n.keys)}: holds {len(keys)} keys, but the offsets in "
                f"'{n.row_ptrs}' end at {sum(ends)} in all ({per_table})"
            )
        table_keys = _keys_per_table(keys, offsets, layout.slot_nums, batch)
        return SparseBatch(dense.reshape(batch, layout.dense_dim), table_keys, tuple(offsets))

    def response(self, scores: Any) -> Any:
        """``OUTPUT0`` of one request from its ``[B, label_dim]`` predictions (NumPy or CuPy).

        Returns:
            ``[1, B * label_dim]``.
        """
        return scores.reshape(1, -1)

    def _batch_size(self, length: int) -> int:
        layout = self.layout
        label = self.names.label(self.names.row_ptrs)
        tables, slots = layout.num_tables, layout.total_slots
        if length < tables or (length - tables) % slots:
            raise RequestError(
                f"{label}: expected {slots} x batch + {tables} offsets "
                f"({_per_table_offsets(layout.slot_nums)}), got {length}"
            )
        batch = (length - tables) // slots
        _check_batch_size(label, batch, layout)
        return batch

    def _fixed_hotness_batch(
        self, dense: np.ndarray, keys: np.ndarray, rows: np.ndarray, batch: int
    ) -> SparseBatch | None:
        """The request's samples when every slot holds the model's hotness of keys (one key,
        or a fixed-length input's ``nnz_per_slot``), else None.

        Then every table's offsets are ``0, h, 2h, ..., B * S_t * h`` (which also makes them
        valid) and ``CATCOLUMN`` is ``[B, K]`` sample-major: the batch keeps it as it is, each
        table's keys a block of its columns, with no offsets to keep and nothing copied. One
        vectorised check instead of a pass per table, which is what most recommender traffic
        (a fixed number of keys per categorical feature) takes.
        """
        layout = self.layout
        if len(keys) != batch * layout.sample_width:
            return None
        if not np.array_equal(rows, _fixed_rowindex(layout.slot_nums, layout.hotness, batch)):
            return None
        return SparseBatch.from_sample_keys(
            dense.reshape(batch, layout.dense_dim),
            keys.reshape(batch, layout.sample_width),
            [t.sample_width for t in layout.tables],
            layout.hotness,
        )

    def _table_offsets(self, rows: np.ndarray, batch: int) -> list[np.ndarray]:
        offsets = []
        start = 0
        label = self.names.label(self.names.row_ptrs)
        for feed in self.layout.tables:
            size = batch * feed.slot_num + 1
            segment = rows[start : start + size].astype(np.int64)
            where = f"{label}: table {feed.table} (entries {start}..{start + size - 1})"
            if segment[0] != 0:
                raise RequestError(f"{where} must start at 0, got {segment[0]}")
            falls = np.flatnonzero(segment[1:] < segment[:-1])
            if falls.size:
                i = int(falls[0]) + 1
                raise RequestError(
                    f"{where} must not decrease: entry {start + i} is {segment[i]} after "
                    f"{segment[i - 1]}"
                )
            limit = self.layout.max_keys(feed.table)
            if segment[-1] > limit:
                raise RequestError(
                    f"{where} has {segment[-1]} keys, more than the {limit} allowed "
                    "(max_batch_size x maxnum_catfeature_query_per_table_per_sample)"
                )
            offsets.append(segment)
            start += size
        return offsets


@functools.lru_cache(maxsize=64)
def _fixed_rowindex(slot_nums: tuple[int, ...], hotness: tuple[int, ...], batch: int) -> np.ndarray:
    """``ROWINDEX`` of a request of ``batch`` samples with ``hotness[t]`` keys in every slot of
    table ``t`` (cached per batch size)."""
    rows = np.concatenate(
        [
            np.arange(0, batch * s * h + 1, h, dtype=np.int32)
            for s, h in zip(slot_nums, hotness, strict=True)
        ]
    )
    rows.flags.writeable = False
    return rows


def _keys_per_table(
    keys: np.ndarray, offsets: Sequence[np.ndarray], slot_nums: Sequence[int], batch: int
) -> tuple[np.ndarray, ...]:
    """Regroup sample-major keys (sample 0: table 0, table 1, ...; sample 1: ...) per table."""
    if len(offsets) == 1:
        return (keys,)
    # Offsets of each sample's first key within its table, and keys per (sample, table).
    firsts = np.stack([o[::s] for o, s in zip(offsets, slot_nums, strict=True)], axis=1)
    counts = np.diff(firsts, axis=0)  # [batch, tables]
    # Where each (sample, table) run starts in the sample-major CATCOLUMN.
    starts = np.concatenate([[0], np.cumsum(counts.ravel())[:-1]]).reshape(batch, -1)
    out = []
    for t in range(len(offsets)):
        shift = np.repeat(starts[:, t] - firsts[:-1, t], counts[:, t])
        out.append(keys[shift + np.arange(firsts[-1, t])])
    return tuple(out)


@dataclass(frozen=True)
class SamplesContract:
    """``dense``, ``sparse`` -> ``score``, one sample per row (see the module docstring).

    Args:
        layout: the model's tables, slots and widths.
    """

    layout: RankingLayout

    def parse(self, dense: np.ndarray, sparse: np.ndarray) -> SparseBatch:
        """Validate one request of samples.

        Args:
            dense: the ``dense`` input, ``[B, D]``.
            sparse: the ``sparse`` input, ``[B, K]``.

        Returns:
            The request's samples: the batch keeps ``sparse`` as it is (each table's keys a
            block of its columns), with no offsets.

        Raises:
            RequestError: naming the input and what is wrong with it.
        """
        _check_dtype(_input(DENSE), dense, np.float32)
        _check_dtype(_input(SPARSE), sparse, np.int64)
        layout = self.layout
        for name, array, width in (
            (DENSE, dense, layout.dense_dim),
            (SPARSE, sparse, layout.sample_width),
        ):
            if array.ndim != 2 or array.shape[1] != width:
                raise RequestError(
                    f"{_input(name)}: expected shape [batch, {width}], got {_shape(array)}"
                )
        batch = dense.shape[0]
        if sparse.shape[0] != batch:
            raise RequestError(
                f"{_input(SPARSE)}: {sparse.shape[0]} samples, but '{DENSE}' has {batch}"
            )
        _check_batch_size(_input(DENSE), batch, layout)
        _check_finite(_input(DENSE), dense, layout.dense_dim)
        return SparseBatch.from_sample_keys(
            dense, sparse, [t.sample_width for t in layout.tables], layout.hotness
        )

    def response(self, scores: Any) -> Any:
        """``score`` of one request: its ``[B, label_dim]`` predictions as they are."""
        return scores


def _runs(values: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(first table, last table, value)`` of each run of tables with one value."""
    runs: list[tuple[int, int, int]] = []
    for table, value in enumerate(values):
        if runs and runs[-1][2] == value:
            runs[-1] = (runs[-1][0], table, value)
        else:
            runs.append((table, table, value))
    return runs


def _tables(first: int, last: int) -> str:
    return f"table {first}" if first == last else f"tables {first}-{last}"


def _per_table_offsets(slot_nums: tuple[int, ...]) -> str:
    """How many offsets each table takes, said once per run of tables with one slot count.

    Example:
        >>> _per_table_offsets((1,) * 26)
        'each of the 26 tables: 1 x batch + 1'
        >>> _per_table_offsets((3,))
        'one table: 3 x batch + 1'
        >>> _per_table_offsets((2,) + (1,) * 25 + (4,))
        'table 0: 2 x batch + 1; tables 1-25: 1 x batch + 1; table 26: 4 x batch + 1'
    """
    if len(slot_nums) == 1:
        return f"one table: {slot_nums[0]} x batch + 1"
    if len(set(slot_nums)) == 1:
        return f"each of the {len(slot_nums)} tables: {slot_nums[0]} x batch + 1"
    return "; ".join(
        f"{_tables(first, last)}: {slots} x batch + 1" for first, last, slots in _runs(slot_nums)
    )
