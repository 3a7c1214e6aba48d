"""Embedding layers at inference: pooling of looked-up vectors per (sample, slot).

The key lookup happens elsewhere (HPS caches and tiers). The dense network receives, per
embedding layer, either the pooled tensor ``[batch, slot_num, vec_size]`` or an
:class:`UnpooledEmbedding`: the looked-up vectors ``[nnz, vec_size]`` with CSR row offsets
over (sample, slot) pairs in sample-major order, which is HugeCTR's ``row_ptrs`` layout.
Pooling follows HugeCTR's inference combiner: the sum accumulates in float32; the mean divides
by the number of keys in the slot, and an empty slot pools to zeros.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hps_core.errors import RequestError
from hps_core.nn.layers.base import Array, Layer
from hps_core.nn.spec.network_json import LayerSpec, SparseInputSpec
from hps_core.nn.spec.precision import ComputeContext
from hps_core.nn.spec.shapes import TensorShape


class Combiner(enum.Enum):
    """How the vectors of one slot are pooled."""

    SUM = "sum"
    MEAN = "mean"


@dataclass(frozen=True)
class UnpooledEmbedding:
    """The looked-up vectors of one embedding layer for one batch, before pooling.

    Args:
        values: ``[nnz, vec_size]`` vectors, one per key, in key order.
        row_offsets: ``[batch * slot_num + 1]`` integers; the keys of sample ``b``, slot ``s``
            are rows ``row_offsets[b * slot_num + s]`` up to ``row_offsets[b * slot_num + s + 1]``
            of ``values``. Starts at 0 and ends at ``nnz``.
    """

    values: Array
    row_offsets: Array


def pool_embeddings(
    xp: Any,
    values: Array,
    row_offsets: Array,
    slot_num: int,
    combiner: Combiner,
    out: Array | None = None,
    where: str = "embedding",
) -> Array:
    """Pool looked-up vectors per (sample, slot).

    Args:
        xp: ``numpy`` or ``cupy``.
        values: ``[nnz, vec_size]`` floating-point vectors.
        row_offsets: ``[batch * slot_num + 1]`` CSR offsets (see :class:`UnpooledEmbedding`).
        slot_num: slots per sample.
        combiner: sum or mean.
        out: optional C-contiguous float32 ``[batch, slot_num, vec_size]`` array to write into.
        where: name used in error messages (the embedding layer).

    Returns:
        float32 ``[batch, slot_num, vec_size]`` (``out`` when given).

    Raises:
        RequestError: shapes, dtypes or offsets are invalid.

    Example:
        >>> import numpy as np
        >>> v = np.arange(6, dtype=np.float32).reshape(3, 2)
        >>> pool_embeddings(np, v, np.array([0, 2, 2, 3]), 3, Combiner.MEAN).tolist()
        [[[1.0, 2.0], [0.0, 0.0], [4.0, 5.0]]]
    """
    values, offsets = _checked_inputs(xp, values, row_offsets, slot_num, where)
    rows, dim, nnz = offsets.shape[0] - 1, values.shape[1], values.shape[0]
    shape = (rows // slot_num, slot_num, dim)
    if out is None:
        out = xp.empty(shape, dtype=np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise RequestError(f"{where}: out must be C-contiguous float32 {shape}, got {out.shape}")
    pooled = out.reshape(rows, dim)
    counts = offsets[1:] - offsets[:-1]
    hotness = nnz // rows if rows else 0
    if rows and hotness * rows == nnz and bool(xp.all(counts == hotness)):
        # Every slot has the same number of keys: a plain reshape and sum, no scatter.
        xp.sum(values.reshape(rows, hotness, dim), axis=1, out=pooled)
    elif xp is np:
        _pool_by_count(values, offsets, counts, pooled)
    else:
        pooled.fill(0)
        segment = xp.searchsorted(offsets[1:], xp.arange(nnz), side="right")
        xp.add.at(pooled, segment, values)
    if combiner is Combiner.MEAN:
        pooled /= xp.maximum(counts, 1)[:, None].astype(np.float32)
    return out


_GATHER_BLOCK_BAGS = 512
"""Bags :func:`pool_gathered` sums at a time: their sums stay in the CPU's caches while each
key's rows are added (a gather of every key's row first wrote a row per key to memory and
read it back: 1.4-3x slower for 1,024 to 16,384 bags of 3 to 100 keys on the 2-core CPU
machine)."""


def pool_gathered(rows: np.ndarray, index: np.ndarray | None, hotness: int) -> np.ndarray:
    """Sums of bags of ``hotness`` keys each from rows looked up once per distinct key
    (NumPy): bag ``i`` sums ``rows[index[i * hotness + j]]`` for ``j`` in key order, in
    float32, exactly as summing a row per key would.

    Args:
        rows: float32 ``[u, dim]`` rows (NumPy; NumPy or CuPy where ``index`` is None).
        index: ``[bags * hotness]`` positions in ``rows`` of the keys, bag after bag; None
            when ``rows`` holds a row per key (``u == bags * hotness``).
        hotness: keys per bag (at least 1).

    Returns:
        float32 ``[bags, dim]``.

    Example:
        >>> rows = np.array([[1.0, 2.0], [10.0, 20.0]], np.float32)
        >>> pool_gathered(rows, np.array([0, 1, 1, 1]), 2).tolist()
        [[11.0, 22.0], [20.0, 40.0]]
    """
    dim = rows.shape[1]
    if index is None:
        return rows.reshape(-1, hotness, dim).sum(axis=1, dtype=np.float32)
    keys = index.reshape(-1, hotness)
    bags = keys.shape[0]
    if bags < _GATHER_BLOCK_BAGS or hotness == 1:
        return rows[keys].sum(axis=1, dtype=np.float32)
    out = np.empty((bags, dim), np.float32)
    added = np.empty((_GATHER_BLOCK_BAGS, dim), np.float32)
    for first in range(0, bags, _GATHER_BLOCK_BAGS):
        block, their = (
            out[first : first + _GATHER_BLOCK_BAGS],
            keys[first : first + _GATHER_BLOCK_BAGS],
        )
        np.take(rows, their[:, 0], axis=0, out=block)
        for j in range(1, hotness):
            np.take(rows, their[:, j], axis=0, out=added[: len(block)])
            block += added[: len(block)]
    return out


# Most bytes of rows one gather of _pool_by_count copies (its temporary, whatever the batch).
_POOL_GATHER_BYTES = 64 << 20


def _pool_by_count(
    values: np.ndarray, offsets: np.ndarray, counts: np.ndarray, pooled: np.ndarray
) -> None:
    """``pooled[i]`` = the sum of bag ``i``'s rows, NumPy: the bags of each key count ``c``
    gathered as ``[n, c, dim]`` and summed over their keys in key order (the order
    ``np.add.at`` adds them in, at a few operations per distinct count instead of one scatter
    per key: 7x less time for 106K bags of up to 40 keys of dim 128 on the 2-core CPU
    machine). Empty bags are zero."""
    pooled.fill(0)
    dim = values.shape[1]
    starts = offsets[:-1]
    for c in np.unique(counts).tolist():
        if c == 0:
            continue
        bags = np.flatnonzero(counts == c)
        step = max(1, _POOL_GATHER_BYTES // (c * dim * values.itemsize))
        for at in range(0, len(bags), step):
            chunk = bags[at : at + step]
            rows = starts[chunk][:, None] + np.arange(c)
            pooled[chunk] = values[rows].sum(axis=1)


def _checked_inputs(
    xp: Any, values: Array, row_offsets: Array, slot_num: int, where: str
) -> tuple[Array, Array]:
    values, offsets = xp.asarray(values), xp.asarray(row_offsets)
    if values.ndim != 2 or values.dtype.kind != "f":
        raise RequestError(
            f"{where}: values must be a 2-D float array, got {values.dtype} {values.shape}"
        )
    length = offsets.shape[0] if offsets.ndim == 1 else 0
    if length == 0 or offsets.dtype.kind not in "iu" or (length - 1) % slot_num:
        raise RequestError(
            f"{where}: row_offsets must be 1-D integers of length batch * {slot_num} + 1, "
            f"got {offsets.dtype} {offsets.shape}"
        )
    offsets = offsets.astype(np.int64, copy=False)
    nnz = values.shape[0]
    if int(offsets[0]) != 0 or int(offsets[-1]) != nnz or bool(xp.any(offsets[1:] < offsets[:-1])):
        raise RequestError(
            f"{where}: row_offsets must rise from 0 to the number of values ({nnz}), "
            f"got {int(offsets[0])} .. {int(offsets[-1])}"
        )
    return values.astype(np.float32, copy=False), offsets


@dataclass(frozen=True)
class EmbeddingLayer(Layer):
    """A HugeCTR sparse embedding layer: its forward pass pools (or checks) the vectors the
    lookup produced for it."""

    type_names = (
        "DistributedSlotSparseEmbeddingHash",
        "LocalizedSlotSparseEmbeddingHash",
        "LocalizedSlotSparseEmbeddingOneHot",
    )
    output_shapes: tuple[TensorShape, ...]
    sparse_input: str
    slot_num: int
    vec_size: int
    combiner: Combiner
    where: str

    @classmethod
    def from_sparse(cls, spec: LayerSpec, sparse: SparseInputSpec) -> EmbeddingLayer:
        """Build the layer for ``spec`` fed by the sparse input ``sparse``.

        Raises:
            ConfigError: a field is invalid.
        """
        if len(spec.bottoms) != 1 or len(spec.tops) != 1:
            raise spec.error("an embedding layer needs exactly one bottom and one top")
        vec_size = spec.int_field("sparse_embedding_hparam.embedding_vec_size", minimum=1)
        raw = spec.raw.get("sparse_embedding_hparam", {}).get("combiner")
        # Old files write the combiner as 0 (sum) or 1 (mean).
        names = {"sum": Combiner.SUM, "mean": Combiner.MEAN, 0: Combiner.SUM, 1: Combiner.MEAN}
        if not isinstance(raw, str | int) or isinstance(raw, bool) or raw not in names:
            raise spec.error(
                f"must be 'sum' or 'mean', got {raw!r}", "sparse_embedding_hparam.combiner"
            )
        shape = TensorShape(1, (sparse.slot_num, vec_size))
        where = f"embedding '{spec.name}'"
        return cls((shape,), sparse.name, sparse.slot_num, vec_size, names[raw], where)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        """Pool an :class:`UnpooledEmbedding`, or check and cast an already pooled array."""
        given = inputs[0]
        if isinstance(given, UnpooledEmbedding):
            pooled = pool_embeddings(
                ctx.xp,
                given.values,
                given.row_offsets,
                self.slot_num,
                self.combiner,
                where=self.where,
            )
            return (ctx.cast(pooled),)
        pooled = ctx.xp.asarray(given)
        slots, vec = self.slot_num, self.vec_size
        if pooled.dtype.kind != "f" or pooled.shape[1:] not in ((slots, vec), (slots * vec,)):
            raise RequestError(
                f"{self.where}: pooled embeddings must be float [batch, {slots}, {vec}], "
                f"got {pooled.dtype} {pooled.shape}"
            )
        return (ctx.cast(pooled.reshape(-1, slots, vec)),)
