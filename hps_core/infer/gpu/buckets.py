"""The size buckets of the GPU pipeline: the buffers a batch passes through, and their graphs.

A batch runs in the bucket of its size padded to the next power of two
(:func:`~hps_core.infer.gpu.staging.bucket_for`), made on first use: a pinned staging buffer
and its device twin (laid out by :class:`~hps_core.infer.gpu.staging.BatchLayout`), the pooled
embeddings (the dense network's input, handed to it as per-table views), the row ``bank_find``
found for each key position, the scores, and a memory pool of its own for the intermediate
tensors of its CUDA graphs, which the pipeline records with :func:`captured`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import cupy
import numpy as np

from hps_core.cuda.structs import PENDING_DTYPE
from hps_core.infer.gpu.placement import Placement
from hps_core.infer.gpu.schedule import ScheduleTrial
from hps_core.infer.gpu.staging import BatchLayout
from hps_core.infer.inputs.layout import RankingLayout
from hps_core.nn.executor import PooledConcat

_GROUPED_STAGING_SAMPLES = 16384
"""From this bucket size on, a batch is staged, copied and looked up in parts (groups of tables
or ranges of samples) by default (see :func:`in_parts_by_default`)."""


@dataclass(frozen=True)
class LookupGraphs:
    """The CUDA graphs of one part's lookup: ``bank_find`` (recorded on the cache stream) and
    the pooling of its bags (recorded on the pool stream)."""

    find: Any
    pool: Any


@dataclass(frozen=True)
class Graphs:
    """The CUDA graphs of a bucket."""

    lookups: tuple[LookupGraphs, ...]  # one per part (per group of tables in a grouped bucket)
    row_lookups: tuple[LookupGraphs, ...]  # a grouped bucket's, per part of a sample-major
    # batch's rows
    insert: Any
    prefix: Any | None  # the dense network's steps on the dense features alone, if any
    dense: Any  # the rest and the download
    row_dense: tuple[Any, ...] = ()  # a grouped bucket's whole dense network and download per
    # part of a sample-major batch's rows (none for a batch-dependent network)


@dataclass
class Bucket:
    """The buffers of one size bucket (see the module docstring), and its graphs once
    recorded."""

    layout: BatchLayout
    staging: np.ndarray  # pinned, the host twin of `inputs`
    inputs: Any
    embeddings: Any
    given: dict[str, Any]
    rows: Any  # per key position, where bank_find found its row (uint64)
    scores_host: np.ndarray  # pinned
    pool: Any
    staging_views: tuple[Any, Any, Any, Any]  # layout.views(staging): made once, read per batch
    input_views: tuple[Any, Any, Any, Any]  # layout.views(inputs)
    pending: Any = None  # keys for the lower tiers (PENDING_DTYPE), models with such tiers
    pending_count: Any = None
    scores: Any = None
    part_scores: dict[int, Any] = field(default_factory=dict)  # per part of rows, scored alone
    prefix: dict[str, Any] | None = None  # outputs of the dense network's dense-only steps
    graphs: Graphs | None = None
    by_part: ScheduleTrial | None = None  # whether a sample-major host batch is scored part
    # by part of its rows or whole (fixed, or timed on the bucket's batches); None until one
    # comes, or where only whole applies
    batches: int = 0
    samples: int = 0  # real samples of the batch staged last
    in_parts: bool = False  # see grouped()


def in_parts_by_default(size: int) -> bool:
    """Whether a bucket of ``size`` samples stages, copies and looks up its batches in parts
    unless told otherwise (the pipeline may time a bucket of the same size that does not)."""
    return size >= _GROUPED_STAGING_SAMPLES


def grouped(bucket: Bucket) -> bool:
    """Whether a batch in ``bucket`` is staged, copied and looked up in parts (groups of
    tables, or ranges of samples of a sample-major batch)."""
    return bucket.in_parts


def new_bucket(
    size: int,
    layout: RankingLayout,
    placement: Placement,
    concat: str | None,
    tops: Mapping[str, str],
    lower: bool,
    pooled: PooledConcat | None = None,
    in_parts: bool | None = None,
) -> Bucket:
    """A bucket of ``size`` samples, its buffers zeroed (no samples, empty bags: what its
    graphs are recorded with), on the current device; the zeroing is queued on the current
    stream, so make that the stream the bucket's uploads go to.

    Args:
        size: samples (a power of two).
        layout: the model's tables and widths.
        placement: where its tables sit in a batch.
        concat: the output of the dense network's Concat of every embedding, if it has one.
        tops: the output tensor of each embedding layer, by layer name.
        lower: a table has tiers below its host tier (the bucket gets room for their keys).
        pooled: the later Concat the embeddings are pooled into (``placement`` was made with
            its ``concat_row``), if any.
        in_parts: whether its batches are staged, copied and looked up in parts (default:
            :func:`in_parts_by_default`).

    Returns:
        The bucket, without graphs.
    """
    lay = BatchLayout(
        size, placement.keys_per_sample, len(placement.slot_table), len(placement.feeds),
        layout.dense_dim,
    )  # fmt: skip
    staging = pinned(lay.nbytes, np.uint8)
    staging[:] = 0  # no samples, empty bags: what the graphs are recorded with
    scores_host = pinned(size * layout.label_dim, np.float32).reshape(size, -1)
    inputs = cupy.zeros(lay.nbytes, dtype=cupy.uint8)
    embeddings = cupy.zeros(size * placement.out_per_sample, dtype=cupy.float32)
    given = _given(embeddings, size, placement, concat, tops, pooled)
    capacity = size * placement.keys_per_sample
    rows = cupy.zeros(max(capacity, 1), dtype=cupy.uint64)
    bucket = Bucket(
        lay, staging, inputs, embeddings, given, rows, scores_host, cupy.cuda.MemoryPool(),
        lay.views(staging), lay.views(inputs),
        in_parts=in_parts_by_default(size) if in_parts is None else in_parts,
    )  # fmt: skip
    if lower:
        bucket.pending = cupy.zeros(max(capacity, 1) * PENDING_DTYPE.itemsize, cupy.uint8)
        bucket.pending_count = cupy.zeros(1, dtype=cupy.uint64)
    return bucket


def _given(
    embeddings: Any,
    size: int,
    placement: Placement,
    concat: str | None,
    tops: Mapping[str, str],
    pooled: PooledConcat | None,
) -> dict[str, Any]:
    """The executor's inputs that live in ``embeddings`` (float32 views): each table's
    ``[B, S_t, D_t]`` output (a strided view when a Concat of all of them is fed instead),
    that Concat's output, and the later Concat's output it is pooled into, if any (with the
    flat ``[B, S * D]`` view of the embeddings that Concat reads)."""
    given = {}
    if concat is not None:
        dim = placement.feeds[0].vec_size
        if pooled is not None:
            wide = embeddings.reshape(size, pooled.width)
            flat = wide[:, pooled.at : pooled.at + placement.slots * dim]
            given[pooled.output], given[pooled.flat] = wide, flat
            stacked = flat.reshape(size, -1, dim)
        else:
            stacked = embeddings.reshape(size, -1, dim)
        given[concat] = stacked
        at = 0
        for f in placement.feeds:
            given[tops[f.layer]] = stacked[:, at : at + f.slot_num]
            at += f.slot_num
        return given
    for f, p in zip(placement.feeds, placement.tables, strict=True):
        start = size * p.out_at
        region = embeddings[start : start + size * f.slot_num * f.vec_size]
        given[tops[f.layer]] = region.reshape(size, f.slot_num, f.vec_size)
    return given


def captured(stream: Any, pool: Any, launch: Any) -> Any:
    """``launch()`` recorded on ``stream`` as a CUDA graph, allocating from ``pool``, and
    uploaded to the device.

    Args:
        stream: the CuPy stream to capture on.
        pool: the bucket's memory pool.
        launch: launches the work to record (no argument).

    Returns:
        The graph (``cupy.cuda.Graph``).
    """
    with stream, cupy.cuda.using_allocator(pool.malloc):
        stream.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        try:
            launch()
        finally:
            graph = stream.end_capture()
    graph.upload(stream)
    stream.synchronize()
    return graph


def pinned(count: int, dtype: Any) -> np.ndarray:
    """A NumPy array in page-locked host memory (fast, asynchronous copies).

    Args:
        count: elements.
        dtype: their NumPy dtype.

    Returns:
        A 1-D array of ``count`` elements (uninitialised).
    """
    dtype = np.dtype(dtype)
    memory = cupy.cuda.alloc_pinned_memory(max(count, 1) * dtype.itemsize)
    return np.frombuffer(memory, dtype, count)
