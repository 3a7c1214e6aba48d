"""The GPU work of one batch, step by step, each step a function of the batch's bucket that a
CUDA graph can record: ``bank_find``, ``bank_pool`` and ``bank_insert`` of
``hps_core/cuda/kernels/bank.cu`` (the lookup of every table and the insert of its misses), the
dense network (whole, its dense-only steps alone, or one part of its rows) and the downloads of
its scores.

Each step launches its work on the current stream and waits for nothing: which stream runs
which step, and after what, is :class:`~hps_core.infer.gpu.pipeline.GpuRankingPipeline`'s
business. The steps hold the device state they share across batches: the tables' descriptors
(:meth:`CacheBank.descriptor_rows`), the slots' and keys' tables, each part's pooling plan, the
batch's miss list and its counts.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import cupy
import numpy as np

from hps_core.cache.kernel_consts import LANES, THREADS
from hps_core.cuda import kernels
from hps_core.cuda.structs import MISS_DTYPE
from hps_core.infer.gpu.bank import CacheBank
from hps_core.infer.gpu.buckets import Bucket
from hps_core.infer.gpu.constants import STATE_STAGED
from hps_core.infer.gpu.placement import Part, Placement, PoolPlan
from hps_core.nn import DenseExecutor

_D2H = cupy.cuda.runtime.memcpyDeviceToHost
_INSERT_BLOCKS_PER_SM = 2
"""Blocks of ``bank_insert`` per SM: few, so that the dense network's GEMMs, which run beside
the insert when caches are shared between processes (and beside the previous batch's insert
otherwise), find room on every SM (eight per SM left them waiting for the insert to drain)."""
_FIND_BY_COLUMN = True
"""``bank_find`` takes a sample-major batch's keys column by column (each table's keys of the
part's samples in turn) rather than sample by sample, so that the host rows it reads in flight
lie in one table's part of the host tier: DLRM-v2's lookup of 16,384 fresh samples with the 0.2
cache (169 MB of misses) took 5.60 ms against 7.24 sample by sample (H200, e2a9b18)."""


class KernelSteps:
    """The steps of a batch on one GPU (see the module docstring), made once the bank opens.

    Args:
        bank: the tables' device state.
        placement: where the tables sit in a batch.
        executor: the dense network; None for lookups alone
            (:class:`~hps_core.infer.gpu.bank_lookup.BankLookup`).
        read_given: the pooled tensors the dense network reads (an FP16 network casts these).
        stream: the stream the scores are downloaded on (the pipeline's main stream).
        bank_kernels: ``bank.cu`` compiled for this GPU.
        samples: the largest bucket's samples (sizes the miss list).
    """

    def __init__(
        self,
        bank: CacheBank,
        placement: Placement,
        executor: DenseExecutor | None,
        read_given: Collection[str],
        stream: Any,
        bank_kernels: Any,
        samples: int,
    ) -> None:
        self.bank = bank
        self.executor = executor
        self.has_prefix = executor is not None and bool(executor.dense_prefix_steps)
        self._read_given = read_given
        self._stream = stream
        self._kernels = bank_kernels
        self.insert_blocks = kernels.sm_count(bank.device_id) * _INSERT_BLOCKS_PER_SM
        capacity = bank.reserve_misses(placement.tables, samples)
        self.has_dynamic_caches = capacity > 0  # miss sets: tables with a cache
        self._misses = cupy.zeros(max(capacity, 1) * MISS_DTYPE.itemsize, cupy.uint8)
        self._state = cupy.zeros(STATE_STAGED + len(placement.feeds), cupy.uint64)
        self.descriptor_rows = bank.descriptor_rows(placement.tables)
        self.descriptors = cupy.asarray(self.descriptor_rows.view(np.uint8))
        self.slot_table = cupy.asarray(placement.slot_table)
        self.slot_local = cupy.asarray(placement.slot_local)
        self._key_table = cupy.asarray(placement.key_table)
        # Each part's pooling plan (its slots: a group's, or every slot), on the device.
        self._pool_plans: dict[tuple[int, int], tuple[PoolPlan, Any]] = {}
        for slots in {*placement.group_slots, (0, placement.slots)}:
            plan = placement.pool_plan(*slots)
            self._pool_plans[slots] = (plan, cupy.asarray(plan.words()))

    @property
    def miss_capacity(self) -> int:
        """Entries of the batch's miss list."""
        return self._misses.nbytes // MISS_DTYPE.itemsize

    def lookup(self, bucket: Bucket, part: Part | None = None) -> None:
        """:meth:`find` then :meth:`pool` of ``part``."""
        self.find(bucket, part)
        self.pool(bucket, part)

    def find(self, bucket: Bucket, part: Part | None = None) -> None:
        """``bank_find`` of the key columns of ``part``'s samples (default: every table, every
        sample); the first part of a batch (column 0, sample 0) empties the miss list first."""
        lay = bucket.layout
        every = ((0, lay.keys_per_sample), (0, lay.slots), (0, lay.size))
        (first_col, stop_col), _, (first_row, stop_row) = part or every
        keys, header, offsets, _ = bucket.input_views
        if first_col == 0 and first_row == 0:
            self._state.fill(0)
        threads, room, size = THREADS, np.int32(lay.keys_per_sample), np.int64(lay.size)
        rows = (np.int64(first_row), np.int64(stop_row))
        positions = (stop_row - first_row) * (stop_col - first_col)
        if positions:
            self._kernels.get_function("bank_find")(
                (-(-positions * LANES // threads),), (threads,),
                (self.descriptors, self._key_table, np.int32(first_col), np.int32(stop_col),
                 *rows, room, size, keys, header, offsets, bucket.rows, self._misses,
                 self._state, np.uint64(self.miss_capacity), self.bank.counters,
                 np.int32(_FIND_BY_COLUMN)),
            )  # fmt: skip

    def pool(self, bucket: Bucket, part: Part | None = None, out: Any = None) -> None:
        """The pooling of the bags of ``part``'s slots and samples (default: all), after its
        :meth:`find`: one ``bank_pool`` launch, as the slots' plan says, into the bucket's
        embeddings or ``out`` (a float32 CuPy array laid out as they are)."""
        lay = bucket.layout
        every = ((0, lay.keys_per_sample), (0, lay.slots), (0, lay.size))
        _, slots, (first_row, stop_row) = part or every
        _, header, offsets, _ = bucket.input_views
        plan, words = self._pool_plans[slots]
        blocks = plan.blocks(stop_row - first_row)
        if blocks == 0:
            return
        self._kernels.get_function("bank_pool")(
            (blocks,), (THREADS,),
            (self.descriptors, self.slot_table, self.slot_local, words,
             np.int64(first_row), np.int64(stop_row), np.int32(lay.keys_per_sample),
             np.int64(lay.size), header, offsets, bucket.rows,
             bucket.embeddings if out is None else out),
        )  # fmt: skip

    def insert(self, bucket: Bucket) -> None:
        """``bank_insert``: the batch's listed misses into their tables' dynamic caches."""
        if bucket.layout.size * bucket.layout.slots == 0:
            return
        self._kernels.get_function("bank_insert")(
            (self.insert_blocks,), (THREADS,),
            (self.descriptors, self._misses, self._state, np.uint64(self.miss_capacity),
             self.bank.counters),
        )  # fmt: skip

    def prefix(self, bucket: Bucket) -> None:
        """The dense network's dense-only steps (a bottom MLP)."""
        dense = bucket.input_views[3]
        # Keeping the outputs keeps their pool blocks for the graphs' later replays.
        bucket.prefix = self.executor.forward_dense_prefix(dense)

    def dense(self, bucket: Bucket) -> None:
        """The dense network (after :meth:`prefix` where it has dense-only steps) and the
        download of the scores."""
        self.forward(bucket, prefix_done=self.has_prefix)
        self.download(bucket)

    def part_dense(self, bucket: Bucket, index: int, part: Part) -> None:
        """The whole dense network (its dense-only steps too) of the rows of ``part``, and the
        download of their scores."""
        _, _, (first, stop) = part
        scores = self.scores(bucket, slice(first, stop))
        # Keeping the scores keeps their pool block for the graph's later replays.
        bucket.part_scores[index] = scores
        cupy.cuda.runtime.memcpyAsync(
            bucket.scores_host[first:stop].ctypes.data, scores.data.ptr, scores.nbytes, _D2H,
            self._stream.ptr,
        )  # fmt: skip

    def forward(self, bucket: Bucket, prefix_done: bool = False) -> None:
        """The dense network; ``prefix_done``: its dense-only steps ran already (their
        outputs are ``bucket.prefix``)."""
        # Keeping the scores keeps their pool block for the graph's later replays.
        bucket.scores = self.scores(bucket, slice(None), prefix_done)

    def scores(self, bucket: Bucket, rows: slice, prefix_done: bool = False) -> Any:
        """The dense network's scores of the bucket's ``rows`` (see :meth:`forward`)."""
        header, dense = bucket.input_views[1], bucket.input_views[3][rows]
        cast = self.executor.ctx.cast  # FP16 networks take half embeddings: one pass each
        given = {
            name: cast(array[rows]) if name in self._read_given else array[rows]
            for name, array in bucket.given.items()
        }
        if prefix_done:
            given |= bucket.prefix or {}
        # The whole bucket: a network whose layers take statistics over the batch (DIN's Dice)
        # reads the number of real samples from the batch's header on the device and leaves
        # the padding out, so its dense step is recorded once per bucket as the others are.
        # (Parts of a batch are scored only by networks without such layers.)
        samples = header[:1] if rows == slice(None) else None
        return self.executor.forward_given(dense, given, prefix_done, samples)

    def download(self, bucket: Bucket) -> None:
        """The copy of the bucket's scores to its pinned host buffer."""
        scores = bucket.scores
        cupy.cuda.runtime.memcpyAsync(
            bucket.scores_host.ctypes.data, scores.data.ptr, scores.nbytes, _D2H,
            self._stream.ptr,
        )  # fmt: skip
