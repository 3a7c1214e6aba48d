"""A ranking model on one GPU: a batch of samples in, scores out, in one pass over the GPU.

Per batch the host validates nothing on the device and waits for the GPU once:

1. the batch is copied into a pinned staging buffer laid out as its device twin
   (:mod:`~hps_core.infer.gpu.staging`: the keys of every table, their CSR row offsets as int32
   unless a table has a fixed hotness, the dense features), padded to a size bucket; a batch
   that keeps its request's ``[B, K]`` key matrix (every table of a fixed hotness) is staged
   as it is, in one copy, sample-major;
2. host-to-device copies of it: one for a small batch; for a large one, one per group of
   tables (or of samples, sample-major), each launched as soon as threads have filled that
   part of the staging buffer;
3. the lookup of every table (for a large table-major batch, of each group of tables right
   after its group's copy, so the lookup of a group overlaps the filling and copying of the
   next): ``bank_find`` finds each key's row, key by key (cache probe, host-tier row index,
   default vector for unknown keys; each missed row copied once per batch into GPU staging
   rows, however often the batch repeats its key), then ``bank_pool`` pools each bag's rows
   in registers straight into the dense network's input (the output of the Concat of all
   embeddings when the network has one);
4. ``bank_insert``: the staged misses go into the dynamic caches, on the GPU (see below for
   when);
5. the dense network (:meth:`~hps_core.nn.DenseExecutor.forward_given`: cuBLASLt products
   with the bias and ReLU in their epilogues, the dot interaction in one kernel); its steps
   that read the dense features alone (DLRM's bottom MLP,
   :meth:`~hps_core.nn.DenseExecutor.forward_dense_prefix`) run on a stream of their own as
   soon as the dense features are on the device, beside the lookup;
6. one device-to-host copy of the scores; the only synchronisation.

Steps 3, 4, the dense-only steps and 5-6 are each recorded once per bucket as CUDA graphs
(batch sizes are padded to the next power of two; padded samples have no keys and their
scores are dropped), so a batch costs four to eleven graph launches however many tables and
layers the model has. The graphs' intermediate tensors live in a memory pool of their own,
which nothing else uses.

Steps 3-4 run on the pipeline's cache stream inside the caches' ordering section
(:meth:`CacheBank.section`), so other streams and, for shared caches, other processes never
see a half-done insert. The dense network waits for the lookup only. With caches of its own,
the insert waits for the scores and runs while the host stages the next batch (beside the
dense network it cost 3-13% of a batch on the H200); with caches shared between processes it
runs at once, beside the dense network (on the main stream, of higher priority), since the
other processes' next lookups wait for it. The next batch's lookup comes after the insert on
the cache stream.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from hps_core.cache.kernel_consts import LANES, THREADS
from hps_core.cuda import kernels
from hps_core.errors import RequestError
from hps_core.infer.batch import SparseBatch
from hps_core.infer.gpu.bank import CacheBank
from hps_core.infer.gpu.constants import STATE_STAGED, bank_defines
from hps_core.infer.gpu.placement import Part, Placement
from hps_core.infer.gpu.staging import BatchLayout, bucket_for, split_copies
from hps_core.infer.gpu.structs import MISS_DTYPE, PENDING_DTYPE, SPAN_DTYPE
from hps_core.infer.layout import RankingLayout, TableFeed
from hps_core.lookup.model_lookup import ModelLookup
from hps_core.nn import DenseExecutor

logger = logging.getLogger("hps_core")

_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
_CAPTURE_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal
_COPY_THREADS = 256
_COPY_BLOCKS = 64
"""Most blocks per span of ``copy_spans`` (16 bytes per thread and step)."""
_INSERT_BLOCKS_PER_SM = 2
"""Blocks of ``bank_insert`` per SM: few, so that the dense network's GEMMs, which run beside
the insert when caches are shared between processes (and beside the previous batch's insert
otherwise), find room on every SM (eight per SM left them waiting for the insert to drain)."""
_INSERT_AFTER_SCORES = True
"""Launch the insert after the dense network, not beside it (caches of its own only)."""
_GROUPED_STAGING_SAMPLES = 16384
"""From this bucket size on, a batch is staged, copied and looked up in groups of tables."""
_THREADED_STAGING_BYTES = 4 << 20
"""From this many bytes of keys on, threads fill each group (NumPy copies release the GIL)."""
_STAGING_GROUPS = 8
_MIN_UPLOAD_BYTES = 2 << 20
"""A grouped batch's parts are copied to the device together until they hold this many bytes:
a copy costs about 11 us on top of its bytes (H200, CUPTI: ten copies of 0.6 MB, a zoo model's
16,384 samples, ran at 24 GB/s where one of 31 MB ran at 49), while the lookup of a part
that waits for the next one's copy loses less than that."""
_DENSE_FEATURES = -1  # see _upload_groups
_STAGING_THREADS = 4
_STAGING_PIECE_BYTES = 4 << 20
"""A threaded fill of a whole batch (or chunk) hands the threads about this many bytes at a
time, queueing each piece's copy as soon as it is filled: a thread-pool round trip per piece
(eight pieces of each 7 MB chunk made DLRM-v2's chunked batch slower than one thread)."""
_CHUNKED_KEY_BYTES = 8 << 20
"""From this many bytes of keys on, a host batch runs as chunks of samples, pipelined: the
host stages the next chunk while the GPU scores the last one (see :meth:`_predict_chunks`)."""
_CHUNK_KEY_BYTES = 4 << 20
"""About this many bytes of keys per chunk (a power of two samples)..."""
_MIN_CHUNK_SAMPLES = 4096
"""...and at least this many samples, so that the dense network's products stay efficient."""
_CHUNK_LANES = 2
"""Buckets per chunk size: a chunk is staged into one while the GPU works on the other's."""
_POOL_SPLIT = 4
"""Groups of ``kernel_consts.LANES`` lanes that share a bag in ``bank_pool`` (a warp) ..."""
_POOL_SPLIT_BAGS = 65536
"""... for launches of at most this many bags, in models with bags longer than a group's
lanes (at most 4 x 8 x 65,536 threads: two waves on an H200)."""
_HIGHEST_PRIORITY = -1000  # lower is more urgent; 0 is the default and least urgent


@dataclass(frozen=True)
class _Graphs:
    """The CUDA graphs of a bucket."""

    lookups: tuple[Any, ...]  # one per part (per group of tables in a grouped bucket)
    row_lookups: tuple[Any, ...]  # a grouped bucket's, per part of a sample-major batch's rows
    insert: Any
    prefix: Any | None  # the dense network's steps on the dense features alone, if any
    dense: Any | None  # the rest and the download; None: a batch-dependent network (eager)


@dataclass
class _Bucket:
    layout: BatchLayout
    staging: np.ndarray  # pinned, the host twin of `inputs`
    inputs: Any
    embeddings: Any
    given: dict[str, Any]
    rows: Any  # per key position, where bank_find found its row (uint64)
    scores_host: np.ndarray  # pinned
    pool: Any
    pending: Any = None  # keys for the lower tiers (PENDING_DTYPE), models with such tiers
    pending_count: Any = None
    scores: Any = None
    prefix: dict[str, Any] | None = None  # outputs of the dense network's dense-only steps
    graphs: _Graphs | None = None
    batches: int = 0
    samples: int = 0  # real samples of the batch staged last


class GpuRankingPipeline:
    """Scores of a ranking model on one GPU, a batch at a time (see the module docstring).

    Args:
        layout: the model's tables and widths.
        executor: its dense network on CuPy, on ``lookup``'s GPU.
        lookup: its lookup on that GPU (tables, caches, shared-cache group).
        graphs: record each bucket as CUDA graphs (``False``: launch every kernel each time;
            for debugging and to measure what the graphs save).

    Example:
        >>> pipeline = GpuRankingPipeline(layout, executor, lookup)  # doctest: +SKIP
        >>> pipeline.predict(batch).shape  # doctest: +SKIP
        (1024, 1)
    """

    def __init__(
        self,
        layout: RankingLayout,
        executor: DenseExecutor,
        lookup: ModelLookup,
        graphs: bool = True,
    ) -> None:
        if lookup.device_id is None:
            raise ValueError("the GPU pipeline needs a model lookup on a GPU")
        self.layout = layout
        self.executor = executor
        self.lookup = lookup
        self.device_id = lookup.device_id
        self.graphs = graphs
        used = set(executor.embedding_names)
        self.feeds: tuple[TableFeed, ...] = tuple(f for f in layout.tables if f.layer in used)
        self._tops = dict(zip(executor.embedding_names, executor.embedding_tops(), strict=True))
        self._has_prefix = bool(executor.dense_prefix_steps)
        self._concat = executor.embedding_concat()
        self.placement = Placement.of(layout, self.feeds, self._concat is not None, _STAGING_GROUPS)
        self._bank: CacheBank | None = None
        self._misses: Any = None  # the batch's miss list (MISS_DTYPE), made with the bank
        self._state: Any = None  # its count, and each table's staged rows (uint64)
        self._lower = False  # a table has tiers below its host tier (set with the bank)
        self._extras: tuple[Any, Any] | None = None  # their rows for the batch in flight
        # Buckets by size, per lane: lane 0 serves every batch, the others chunked ones.
        self._lanes: list[dict[int, _Bucket]] = [{} for _ in range(_CHUNK_LANES)]
        self._buckets = self._lanes[0]
        self._lock = threading.Lock()
        self._copy_pool: concurrent.futures.ThreadPoolExecutor | None = None
        with cupy.cuda.Device(self.device_id):
            # The main stream (copies, dense network) outranks the cache stream (lookup and
            # insert), so the dense network's blocks go first while an insert runs beside it.
            # CUDA clamps a priority into the device's range.
            self._stream = cupy.cuda.Stream(non_blocking=True, priority=_HIGHEST_PRIORITY)
            self._cache_stream = cupy.cuda.Stream(non_blocking=True, priority=0)
            # The dense-only steps (a bottom MLP) run beside the lookup on a stream of their own.
            self._prefix_stream = cupy.cuda.Stream(non_blocking=True, priority=_HIGHEST_PRIORITY)
            self._prefixed = cupy.cuda.Event(disable_timing=True)
            self._dense_uploaded = cupy.cuda.Event(disable_timing=True)
            self._uploaded = [
                cupy.cuda.Event(disable_timing=True)
                for _ in range(max(len(self.placement.group_slots), _STAGING_GROUPS))
            ]
            self._looked_up = cupy.cuda.Event(disable_timing=True)
            self._chunk_done = [cupy.cuda.Event(disable_timing=True) for _ in range(_CHUNK_LANES)]
            self._scored = cupy.cuda.Event(disable_timing=True)
            self._bank_kernels = kernels.module("bank", self.device_id, defines=bank_defines())
            self._copy_spans = kernels.module("copy", self.device_id).get_function("copy_spans")
            # A batch on the device has one key array per table, offsets for each multi-hot
            # one, and its dense features.
            spans = 1 + 2 * len(self.feeds)
            self._spans_host = _pinned(spans, SPAN_DTYPE)
            self._spans_device = cupy.empty(spans * SPAN_DTYPE.itemsize, dtype=cupy.uint8)
            self._insert_blocks = (
                cupy.cuda.Device().attributes["MultiProcessorCount"] * _INSERT_BLOCKS_PER_SM
            )

    @property
    def bank(self) -> CacheBank:
        """The device state of the tables (opened on first use)."""
        if self._bank is None:
            bank = CacheBank(self.lookup, [p.table for p in self.placement.tables])
            self._lower = any(bank.lower)
            with cupy.cuda.Device(self.device_id):
                samples = bucket_for(self.layout.max_batch_size)
                capacity = bank.reserve_misses(self.placement.tables, samples)
                self._misses = cupy.zeros(max(capacity, 1) * MISS_DTYPE.itemsize, cupy.uint8)
                self._state = cupy.zeros(STATE_STAGED + len(self.feeds), cupy.uint64)
                self._descriptor_rows = bank.descriptor_rows(self.placement.tables)
                self._descriptors = cupy.asarray(self._descriptor_rows.view(np.uint8))
                self._slot_table_d = cupy.asarray(self.placement.slot_table)
                self._slot_local_d = cupy.asarray(self.placement.slot_local)
                self._key_table_d = cupy.asarray(self.placement.key_table)
            self._bank = bank
        return self._bank

    # -- serving ------------------------------------------------------------------------------

    def predict(self, batch: SparseBatch) -> np.ndarray:
        """Scores of every sample of ``batch``.

        Args:
            batch: host arrays, validated by a request contract (offsets rise from 0 to the
                number of keys of each table); or CuPy arrays on this pipeline's GPU (as
                HugeCTR's ``lookup_fromdlpack`` takes them), whose values are not read back:
                the lookup keeps out-of-range offsets inside each table's keys.

        Returns:
            float32 ``[batch_size, label_dim]`` on the host.

        Raises:
            RequestError: the batch does not fit the model, or its arrays are on another GPU.
        """
        samples = batch.batch_size
        if samples == 0:
            return np.empty((0, self.layout.label_dim), np.float32)
        if isinstance(batch.dense, cupy.ndarray):
            self._check_device_batch(batch)
        size = bucket_for(max(samples, self._samples_for_keys(batch)))
        with self._lock, cupy.cuda.Device(self.device_id):
            bank = self.bank
            # Tables whose lower tiers may hold rows (RocksDB, Redis, an update overlay with
            # new keys) cost a host round trip per batch; the others never do (one more fetch
            # clears the extra rows a last fetch left).
            fetch = self._lower and (self._extras is not None or bank.lower_may_answer())
            on_host = not isinstance(batch.dense, cupy.ndarray)
            chunk = self._chunk_samples(batch) if on_host and not fetch else None
            if chunk is not None:
                scores = self._predict_chunks(batch, chunk)
                bank.batches += 1
                return scores
            bucket = self._bucket(size)
            if _grouped(bucket) and on_host and not fetch:
                if self._sample_major(batch):
                    self._run(bucket, self._upload_rows(bucket, batch), by_rows=True)
                else:
                    self._run(bucket, self._upload_groups(bucket, batch))
            else:
                self._stage_and_upload(bucket, batch)
                if fetch:
                    self._fetch_lower(bucket)
                self._run(bucket)
            self._stream.synchronize()
            bank.batches += 1
            bucket.batches += 1
            return bucket.scores_host[:samples].copy()

    def _chunk_samples(self, batch: SparseBatch) -> int | None:
        """Samples per chunk of a host batch run as chunks, or None to run it whole: a batch
        with many keys (their staging, a host memory copy, takes as long as the GPU's work),
        of a network whose layers see each sample alone (DIN's Dice takes statistics over
        the batch)."""
        key_bytes = sum(int(k.nbytes) for k in batch.keys)
        samples = batch.batch_size
        if (
            self.executor.batch_dependent
            or key_bytes < _CHUNKED_KEY_BYTES
            or samples < 2 * _MIN_CHUNK_SAMPLES
        ):
            return None
        per_chunk = max(samples * _CHUNK_KEY_BYTES // key_bytes, 1)
        return max(_MIN_CHUNK_SAMPLES, 1 << (per_chunk.bit_length() - 1))

    def _predict_chunks(self, batch: SparseBatch, chunk: int) -> np.ndarray:
        """Scores of a host batch run as chunks of ``chunk`` samples, each a batch of its own
        (its lookup, insert and dense network, as :meth:`predict` runs them) on buckets of
        two lanes: while the GPU scores chunk ``i``, the host stages chunk ``i + 1`` into the
        other lane's bucket, and it waits only before reusing a lane, for the chunk that last
        used it. Chunks see the caches as successive batches would."""
        samples = batch.batch_size
        scores = np.empty((samples, self.layout.label_dim), np.float32)
        in_flight: dict[int, tuple[_Bucket, int]] = {}  # lane: (its bucket, first sample)

        def collect(lane: int) -> None:
            if lane in in_flight:
                bucket, first = in_flight.pop(lane)
                self._chunk_done[lane].synchronize()
                scores[first : first + bucket.samples] = bucket.scores_host[: bucket.samples]

        for index, first in enumerate(range(0, samples, chunk)):
            lane = index % _CHUNK_LANES
            part = batch.sample_range(first, min(first + chunk, samples))
            collect(lane)
            size = bucket_for(max(part.batch_size, self._samples_for_keys(part)))
            bucket = self._bucket(size, lane)
            # The calling thread alone stages a chunk: the GPU's work on the last chunk bounds
            # the pipeline, and staging threads only took memory bandwidth from it (DLRM-v2,
            # 16,384 samples in chunks of 4,096 on the H200: 5.49 ms a batch without threads,
            # 5.71 with four on one piece, 5.94 on 4 MB pieces; benchmarks/chunked_staging.py).
            self._stage_and_upload(bucket, part, threaded=False)
            self._run(bucket)
            self._chunk_done[lane].record(self._stream)
            bucket.batches += 1
            in_flight[lane] = (bucket, first)
        for lane in list(in_flight):
            collect(lane)
        return scores

    def _check_device_batch(self, batch: SparseBatch) -> None:
        arrays = [batch.dense, *batch.keys, *(o for o in batch.row_offsets if o is not None)]
        for array in arrays:
            if not isinstance(array, cupy.ndarray):
                raise RequestError(
                    "a batch on the GPU needs every array on the GPU (dense, keys, offsets)"
                )
            if array.device.id != self.device_id:
                raise RequestError(
                    f"the batch is on GPU {array.device.id}; model '{self.layout.model}' runs "
                    f"on GPU {self.device_id}"
                )

    def _samples_for_keys(self, batch: SparseBatch) -> int:
        """Samples whose key capacity holds every table's keys (multi-hot requests may carry
        more keys per sample than ``maxnum_catfeature_query_per_table_per_sample``)."""
        need = 0
        for f in self.feeds:
            n = int(batch.keys[f.table].size)
            need = max(need, -(-n // max(f.max_keys_per_sample, 1)))
        return need

    def _sample_major(self, batch: SparseBatch) -> bool:
        """Whether the batch's keys are staged as its ``[B, K]`` request matrix (one copy):
        it keeps one, and its columns are exactly every table's key room (its hotness is the
        samples contract's, which fills every table's room)."""
        keys = batch.sample_keys
        return (
            keys is not None
            and self.placement.sample_hotness is not None
            and batch.hotness == self.placement.sample_hotness
            and keys.ndim == 2
            and keys.shape[1] == self.placement.keys_per_sample
            and keys.strides[1] == keys.itemsize
        )

    def _stage_and_upload(self, bucket: _Bucket, batch: SparseBatch, threaded: bool = True) -> None:
        """Fill the staging buffer and copy it to the device on the main stream; a batch
        already on the device is copied in place there instead, after the header. Threads
        fill large host batches unless ``threaded`` is False."""
        lay = bucket.layout
        if isinstance(batch.dense, cupy.ndarray):
            head, groups = self._stage(bucket, batch, bucket.inputs)
            # The caller's stream may still be writing the arrays (DLPack's contract: the
            # consumer orders itself after the producer's stream).
            caller = cupy.cuda.get_current_stream()
            if caller.ptr != self._stream.ptr:
                self._stream.wait_event(caller.record())
            # Header and padded offsets from the host, then the batch's own arrays over the
            # rest of their regions, in stream order.
            self._upload(bucket, lay.header_at, lay.nbytes)
            with self._stream:
                self._gather_on_device([c for copies in (head, *groups) for c in copies])
            return
        if _grouped(bucket) and not self._sample_major(batch):
            for _ in self._upload_groups(bucket, batch):
                pass
            return
        head, groups = self._stage(bucket, batch, bucket.staging)
        _copy_all(head)
        keys = [c for copies in groups for c in copies]
        nbytes = sum(t.nbytes for t, _ in keys)
        if nbytes < _THREADED_STAGING_BYTES or not threaded:
            _copy_all(keys)
            self._upload(bucket, 0, lay.nbytes)
            return
        # Many keys: threads fill the staging buffer part by part, each part's copy to the
        # device queued as soon as it is filled (a sample-major batch is one run of bytes).
        self._upload(bucket, lay.header_at, lay.nbytes)
        for part in split_copies(keys, max(1, nbytes // _STAGING_PIECE_BYTES)):
            list(self._copier().map(_copy_all, split_copies(part, _STAGING_THREADS)))
            for target, _ in part:
                start = target.ctypes.data - bucket.staging.ctypes.data
                self._upload(bucket, start, start + target.nbytes)

    def _gather_on_device(self, copies: Sequence[tuple[Any, Any]]) -> None:
        """``_copy_all`` for CuPy arrays, on the current (main) stream: the copies whose
        source and target are contiguous and alike in one ``copy_spans`` launch, after one
        upload of its span table (two calls, where a ``cudaMemcpyAsync`` per array costs a
        few microseconds each); the others (strided, or of another dtype) as CuPy copies,
        which also cast and raise on a shape that does not fit."""
        spans = self._spans_host
        count = widest = 0
        for target, source in copies:
            alike = source.shape == target.shape and source.dtype == target.dtype
            if not (alike and source.flags.c_contiguous and target.flags.c_contiguous):
                target[...] = source
            elif source.nbytes:
                spans[count] = (source.data.ptr, target.data.ptr, source.nbytes)
                count += 1
                widest = max(widest, source.nbytes)
        if count == 0:
            return
        cupy.cuda.runtime.memcpyAsync(
            self._spans_device.data.ptr, spans.ctypes.data, count * SPAN_DTYPE.itemsize, _H2D,
            self._stream.ptr,
        )  # fmt: skip
        blocks = min(_COPY_BLOCKS, -(-widest // (16 * _COPY_THREADS)))
        self._copy_spans((blocks, count), (_COPY_THREADS,), (self._spans_device,))

    def _upload_rows(self, bucket: _Bucket, batch: SparseBatch) -> Iterator[int]:
        """Stage and copy a sample-major host batch part by part of its samples (see
        :meth:`Placement.row_parts`): the header (one copy), each part's rows of the key
        matrix (filled by threads), then the dense features. Yield each part's index once its
        copy is queued on the main stream, then ``_DENSE_FEATURES``."""
        lay = bucket.layout
        head, groups = self._stage(bucket, batch, bucket.staging)
        (target, source), samples = groups[0][0], batch.batch_size
        self._upload(bucket, lay.header_at, lay.dense_at)
        row_bytes = lay.keys_per_sample * 8
        parts = self.placement.row_parts(bucket.layout.size, _grouped(bucket))
        ready: list[int] = []
        start = None  # first sample of the parts filled and not yet copied
        for index, (_, _, (first, stop)) in enumerate(parts):
            a, b = min(first, samples), min(stop, samples)
            if b > a:
                copies = [(target[a:b], source[a:b])]
                if copies[0][0].nbytes >= _THREADED_STAGING_BYTES // _STAGING_GROUPS:
                    list(self._copier().map(_copy_all, split_copies(copies, _STAGING_THREADS)))
                else:
                    _copy_all(copies)
                start = a if start is None else start
            ready.append(index)
            last = index == len(parts) - 1
            if start is not None and (last or (b - start) * row_bytes >= _MIN_UPLOAD_BYTES):
                self._upload(bucket, start * row_bytes, b * row_bytes)
                start = None
            if start is None:
                yield from ready
                ready = []
        _copy_all(head)
        self._upload(bucket, lay.dense_at, lay.nbytes)
        yield _DENSE_FEATURES

    def _upload_groups(self, bucket: _Bucket, batch: SparseBatch) -> Iterator[int]:
        """Stage and copy a table-major host batch in the order the GPU needs it: the header
        and row offsets (one copy), each group's keys (filled by threads), then the dense
        features, which the lookups do not read. Yield each group's index once its copy is
        queued on the main stream, then ``_DENSE_FEATURES``."""
        lay = bucket.layout
        head, groups = self._stage(bucket, batch, bucket.staging)
        dense, offsets = head[:1], head[1:]
        _copy_all(offsets)
        self._upload(bucket, lay.header_at, lay.dense_at)
        threaded = sum(t.nbytes for g in groups for t, _ in g) >= _THREADED_STAGING_BYTES
        column_bytes = lay.size * 8
        ready: list[int] = []
        start = None  # first key column of the groups filled and not yet copied
        for group, ((first, stop), copies) in enumerate(
            zip(self.placement.group_keys, groups, strict=True)
        ):
            if threaded:
                list(self._copier().map(_copy_all, split_copies(copies, _STAGING_THREADS)))
            else:
                _copy_all(copies)
            start = first if start is None else start
            ready.append(group)
            last = group == len(groups) - 1
            if last or (stop - start) * column_bytes >= _MIN_UPLOAD_BYTES:
                self._upload(bucket, start * column_bytes, stop * column_bytes)
                yield from ready
                ready, start = [], None
        _copy_all(dense)
        self._upload(bucket, lay.dense_at, lay.nbytes)
        yield _DENSE_FEATURES

    def _stage(
        self, bucket: _Bucket, batch: SparseBatch, buffer: Any
    ) -> tuple[list[tuple[Any, Any]], list[list[tuple[Any, Any]]]]:
        """Write the header and the padded samples' offsets into the staging buffer; return
        the copies that fill the rest of ``buffer`` (the staging buffer, or the device input
        buffer for a batch on the device): ``(target, source)`` pairs for the header region
        (the dense features first, then the row offsets) and for the keys: of each group of
        tables (table-major), or one list holding the batch's whole key matrix (sample-major,
        see :meth:`_sample_major`)."""
        lay = bucket.layout
        keys, _, offsets, dense = lay.views(buffer)
        _, header, host_offsets, _ = lay.views(bucket.staging)
        samples = batch.batch_size
        if batch.dense.shape != (samples, lay.dense_dim):
            raise RequestError(
                f"dense features must be [batch, {lay.dense_dim}], got {batch.dense.shape}"
            )
        header[0] = samples
        bucket.samples = samples
        head = [(dense[:samples], batch.dense)]
        if self._sample_major(batch):
            header[1] = 1
            header[2:] = self.placement.sample_hotness
            matrix = keys.reshape(lay.size, lay.keys_per_sample)
            return head, [[(matrix[:samples], batch.sample_keys)]]
        header[1] = 0
        groups: list[list[tuple[Any, Any]]] = [[] for _ in self.placement.group_keys]
        for u, (f, p) in enumerate(zip(self.feeds, self.placement.tables, strict=True)):
            table_keys = batch.keys[f.table]
            hot = batch.table_hotness(f.table)
            header[2 + u] = hot or 0
            start = lay.size * p.keys_at
            target = keys[start : start + table_keys.size]
            groups[self.placement.table_group[u]].append(
                (target.reshape(table_keys.shape), table_keys)
            )
            if hot is not None:
                continue  # a fixed hotness (RankingSession checked the key count)
            row_offsets = batch.row_offsets[f.table]
            bags = samples * f.slot_num
            at = lay.size * p.offsets_at + u
            head.append((offsets[at : at + bags + 1], row_offsets))
            # Padded samples: empty bags after the last key.
            host_offsets[at + bags + 1 : at + lay.size * f.slot_num + 1] = table_keys.size
        return head, groups

    def _fetch_lower(self, bucket: _Bucket) -> None:
        """Fetch, through the host, the keys of the uploaded batch that neither a cache nor a
        host tier holds from the tiers below (Redis, RocksDB): ``bank_probe`` lists them on
        the GPU, the host reads the list (the one round trip such a model pays per batch),
        asks each table's lower tiers for its unique keys, and hands the rows found to
        ``bank_find`` as each table's sorted extra rows (descriptor fields ``extra_*``),
        which it stages, pools and inserts like the host tier's rows. A model without lower tiers
        never comes here."""
        main, cache = self._stream, self._cache_stream
        lay = bucket.layout
        keys, header, offsets, _ = lay.views(bucket.inputs)
        self._uploaded[0].record(main)
        with cache, self.bank.section():
            cache.wait_event(self._uploaded[0])
            bucket.pending_count.fill(0)
            bags = lay.size * lay.slots
            if bags:
                self._bank_kernels.get_function("bank_probe")(
                    (-(-bags * LANES // THREADS),), (THREADS,),
                    (self._descriptors, self._slot_table_d, self._slot_local_d, np.int32(0),
                     np.int32(lay.slots), np.int32(lay.keys_per_sample), np.int64(lay.size),
                     keys, header, offsets, bucket.pending, bucket.pending_count,
                     np.uint64(bucket.pending.nbytes // PENDING_DTYPE.itemsize)),
                )  # fmt: skip
            pending_count = bucket.pending_count.get(stream=cache)
        # The probe followed the last batch's insert on the cache stream: once it is done,
        # nothing reads the last batch's extra rows any more.
        cache.synchronize()
        had_extras, self._extras = self._extras is not None, None
        n = min(int(pending_count[0]), bucket.pending.nbytes // PENDING_DTYPE.itemsize)
        rows = self._descriptor_rows
        rows["extra_keys"] = rows["extra_values"] = rows["extra_count"] = 0
        if n:
            pending = bucket.pending[: n * PENDING_DTYPE.itemsize].get().view(PENDING_DTYPE)
            self._extras = self._extra_rows(pending, rows)
        if self._extras is not None or had_extras:
            with cache:
                self._descriptors.set(rows.view(np.uint8), stream=cache)

    def _extra_rows(self, pending: np.ndarray, rows: np.ndarray) -> tuple[Any, Any] | None:
        """Look the pending keys up in their tables' lower tiers; upload the rows found, each
        table's keys sorted with its rows 16-byte aligned, and point ``rows`` (the host copy
        of the descriptors) at them. Returns the device buffers (kept until the batch's
        insert has run), or None when no key was found."""
        key_parts: list[np.ndarray] = []
        value_parts: list[np.ndarray] = []
        spans = []  # (position, first key, first float, count)
        at_key = at_float = 0
        for position in np.unique(pending["table"]).tolist():
            table_keys = np.unique(pending["key"][pending["table"] == position])
            values, found = self.bank.lookup_lower(position, table_keys)
            count = int(found.sum())
            if count == 0:
                continue
            dim = int(rows[position]["dim"])
            block = np.zeros(-(-count * dim // 4) * 4, np.float32)
            block[: count * dim] = values[found].reshape(-1)
            key_parts.append(table_keys[found])
            value_parts.append(block)
            spans.append((position, at_key, at_float, count))
            at_key += count
            at_float += block.shape[0]
        if not spans:
            return None
        with self._cache_stream:  # before the lookup that reads them, on its stream
            keys_d = cupy.asarray(np.concatenate(key_parts))
            values_d = cupy.asarray(np.concatenate(value_parts))
        for position, first_key, first_float, count in spans:
            rows[position]["extra_keys"] = keys_d.data.ptr + 8 * first_key
            rows[position]["extra_values"] = values_d.data.ptr + 4 * first_float
            rows[position]["extra_count"] = count
        return keys_d, values_d

    def _copier(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._copy_pool is None:
            self._copy_pool = concurrent.futures.ThreadPoolExecutor(
                _STAGING_THREADS, thread_name_prefix=f"hps-stage-{self.layout.model}"
            )
        return self._copy_pool

    def _run(
        self,
        bucket: _Bucket,
        uploaded: Iterable[int] | None = None,
        dense: bool = True,
        by_rows: bool = False,
    ) -> None:
        """Lookups and insert on the cache stream, the dense network and the download on the
        main stream after the lookups (see the module docstring).

        Args:
            bucket: the batch's bucket.
            uploaded: None when the main stream holds the copy of the whole batch (every
                lookup follows it); else, for a grouped bucket, yields each group of tables
                once the main stream holds its copy (that group's lookup follows the copy),
                then ``_DENSE_FEATURES`` once it holds the dense features (the dense-only steps
                follow). The lookups and the insert of a batch are one ordering section: with
                caches shared between processes, another process's lookups and inserts never
                fall between those of this batch's groups (which would make every group's
                lookup wait for the other process's latest work).
            dense: ``False``: the lookups and insert only.
            by_rows: ``uploaded`` yields parts of :meth:`Placement.row_parts` (a sample-major
                batch in a grouped bucket), not groups of tables.
        """
        main, cache = self._stream, self._cache_stream
        parts = (
            self.placement.row_parts(bucket.layout.size, _grouped(bucket))
            if by_rows
            else self.placement.parts(bucket.layout.size, _grouped(bucket))
        )
        with cache, self.bank.section():
            for group in uploaded or ():
                if group == _DENSE_FEATURES:
                    self._dense_uploaded.record(main)
                    self._launch_prefix(bucket, self._dense_uploaded)
                    continue
                self._uploaded[group].record(main)
                cache.wait_event(self._uploaded[group])
                self._launch_lookup(bucket, group, parts[group], by_rows)
            if uploaded is None:
                self._uploaded[0].record(main)
                self._launch_prefix(bucket, self._uploaded[0])
                cache.wait_event(self._uploaded[0])
                for index, part in enumerate(parts):
                    self._launch_lookup(bucket, index, part)
            self._looked_up.record(cache)
            # With caches of its own, the insert waits for the scores: it then runs while the
            # host stages the next batch rather than beside the dense network. Caches shared
            # with other processes take it at once, since their next lookups wait for it.
            deferred = dense and _INSERT_AFTER_SCORES and self.lookup.cache_group is None
            if not deferred:
                self._launch_insert(bucket)
        main.wait_event(self._looked_up)
        if self._has_prefix:
            main.wait_event(self._prefixed)
        if not dense:
            return
        try:
            with main:
                if bucket.graphs is not None and bucket.graphs.dense is not None:
                    bucket.graphs.dense.launch(main)
                else:
                    with cupy.cuda.using_allocator(bucket.pool.malloc):
                        self._dense_step(bucket)
        finally:
            # Even after a failed dense step: the insert also empties the batch's miss sets,
            # which the next batch's lookup must find empty.
            if deferred:
                self._scored.record(main)
                with cache, self.bank.section():
                    cache.wait_event(self._scored)
                    self._launch_insert(bucket)

    def _launch_insert(self, bucket: _Bucket) -> None:
        if bucket.graphs is not None:
            bucket.graphs.insert.launch(self._cache_stream)
        else:
            self._insert(bucket)

    def _launch_lookup(
        self, bucket: _Bucket, index: int, part: Part, by_rows: bool = False
    ) -> None:
        if bucket.graphs is not None:
            graphs = bucket.graphs.row_lookups if by_rows else bucket.graphs.lookups
            graphs[index].launch(self._cache_stream)
        else:
            self._lookup(bucket, part)

    def _launch_prefix(self, bucket: _Bucket, uploaded: Any) -> None:
        """The dense-only steps on the prefix stream, after the event ``uploaded`` (the main
        stream holds the dense features)."""
        if not self._has_prefix:
            return
        stream = self._prefix_stream
        stream.wait_event(uploaded)
        if bucket.graphs is not None and bucket.graphs.prefix is not None:
            bucket.graphs.prefix.launch(stream)
        else:
            with stream, cupy.cuda.using_allocator(bucket.pool.malloc):
                self._prefix_step(bucket)
        self._prefixed.record(stream)

    def _prefix_step(self, bucket: _Bucket) -> None:
        dense = bucket.layout.views(bucket.inputs)[3]
        # Keeping the outputs keeps their pool blocks for the graphs' later replays.
        bucket.prefix = self.executor.forward_dense_prefix(dense)

    def _dense_step(self, bucket: _Bucket) -> None:
        self._forward(bucket, prefix_done=self._has_prefix)
        self._download(bucket)

    def _upload(self, bucket: _Bucket, start: int, stop: int) -> None:
        """Copy bytes ``[start, stop)`` of the staging buffer to the device (main stream)."""
        cupy.cuda.runtime.memcpyAsync(
            bucket.inputs.data.ptr + start, bucket.staging.ctypes.data + start, stop - start,
            _H2D, self._stream.ptr,
        )  # fmt: skip

    def _lookup(self, bucket: _Bucket, part: Part | None = None) -> None:
        """``bank_find`` of the key columns and ``bank_pool`` of the slots of ``part``'s
        samples (default: every table, every sample); the first part of a batch (column 0,
        sample 0) empties the miss list first."""
        lay = bucket.layout
        every = ((0, lay.keys_per_sample), (0, lay.slots), (0, lay.size))
        (first_col, stop_col), (first, stop), (first_row, stop_row) = part or every
        keys, header, offsets, _ = lay.views(bucket.inputs)
        if first_col == 0 and first_row == 0:
            self._state.fill(0)
        threads, room, size = THREADS, np.int32(lay.keys_per_sample), np.int64(lay.size)
        rows = (np.int64(first_row), np.int64(stop_row))
        positions = (stop_row - first_row) * (stop_col - first_col)
        if positions:
            self._bank_kernels.get_function("bank_find")(
                (-(-positions * LANES // threads),), (threads,),
                (self._descriptors, self._key_table_d, np.int32(first_col), np.int32(stop_col),
                 *rows, room, size, keys, header, offsets, bucket.rows, self._misses,
                 self._state, np.uint64(self._miss_capacity), self._bank.counters),
            )  # fmt: skip
        bags = (stop_row - first_row) * (stop - first)
        if bags:
            # Few bags, some long: a warp per bag (see bank_pool), the batch's lookup being
            # the latency of its longest bag.
            split = _POOL_SPLIT if self.placement.long_bags and bags <= _POOL_SPLIT_BAGS else 1
            self._bank_kernels.get_function("bank_pool")(
                (-(-bags * LANES * split // threads),), (threads,),
                (self._descriptors, self._slot_table_d, self._slot_local_d, np.int32(first),
                 np.int32(stop), *rows, room, size, header, offsets, bucket.rows,
                 bucket.embeddings, np.int32(split)),
            )  # fmt: skip

    def _insert(self, bucket: _Bucket) -> None:
        if bucket.layout.size * bucket.layout.slots == 0:
            return
        self._bank_kernels.get_function("bank_insert")(
            (self._insert_blocks,), (THREADS,),
            (self._descriptors, self._misses, self._state, np.uint64(self._miss_capacity),
             self._bank.counters),
        )  # fmt: skip

    @property
    def _miss_capacity(self) -> int:
        return self._misses.nbytes // MISS_DTYPE.itemsize

    def _forward(self, bucket: _Bucket, prefix_done: bool = False) -> None:
        """The dense network; ``prefix_done``: its dense-only steps ran already (their
        outputs are ``bucket.prefix``)."""
        # A network whose layers take statistics over the batch (DIN's Dice) sees the real
        # samples only, never the bucket's padding (it has no dense-only steps).
        rows = slice(0, bucket.samples) if self.executor.batch_dependent else slice(None)
        dense = bucket.layout.views(bucket.inputs)[3][rows]
        cast = self.executor.ctx.cast  # FP16 networks take half embeddings: one pass each
        given = {name: cast(array[rows]) for name, array in bucket.given.items()}
        if prefix_done:
            given |= bucket.prefix or {}
        # Keeping the scores keeps their pool block for the graph's later replays.
        bucket.scores = self.executor.forward_given(dense, given, prefix_done=prefix_done)

    def _download(self, bucket: _Bucket) -> None:
        scores = bucket.scores
        cupy.cuda.runtime.memcpyAsync(
            bucket.scores_host.ctypes.data, scores.data.ptr, scores.nbytes, _D2H,
            self._stream.ptr,
        )  # fmt: skip

    def profile(self, batch: SparseBatch) -> dict[str, float]:
        """Run one batch step by step on one stream, without graphs, timing each step with
        CUDA events.

        Args:
            batch: as for :meth:`predict` (its misses are inserted, as in ``predict``).

        Returns:
            GPU milliseconds of ``upload``, ``lookup``, ``insert``, ``forward`` (the dense
            network) and ``download``.
        """
        size = bucket_for(max(batch.batch_size, self._samples_for_keys(batch)))
        with self._lock, cupy.cuda.Device(self.device_id), self._stream:
            bucket = self._bucket(size)
            on_device = isinstance(batch.dense, cupy.ndarray)
            if on_device:
                self._check_device_batch(batch)
            head, groups = self._stage(
                bucket, batch, bucket.inputs if on_device else bucket.staging
            )
            if not on_device:  # the host's part is not timed
                for copies in (head, *groups):
                    _copy_all(copies)

            def upload(b: _Bucket) -> None:
                if not on_device:
                    self._upload(b, 0, b.layout.nbytes)
                    return
                self._upload(b, b.layout.header_at, b.layout.nbytes)
                for copies in (head, *groups):
                    _copy_all(copies)

            steps = {
                "upload": upload,
                "lookup": self._lookup,
                "insert": self._insert,
                "forward": self._forward,
                "download": self._download,
            }
            events = [cupy.cuda.Event() for _ in range(len(steps) + 1)]
            events[0].record(self._stream)
            with self.bank.section(), cupy.cuda.using_allocator(bucket.pool.malloc):
                for step, event in zip(steps.values(), events[1:], strict=True):
                    step(bucket)
                    event.record(self._stream)
            events[-1].synchronize()
            return {
                name: cupy.cuda.get_elapsed_time(start, stop)
                for name, start, stop in zip(steps, events[:-1], events[1:], strict=True)
            }

    # -- buckets ------------------------------------------------------------------------------

    def _bucket(self, size: int, lane: int = 0) -> _Bucket:
        """The bucket of ``size`` samples (made and recorded on first use) of ``lane``: lanes
        other than 0 hold the further buckets of chunked batches (see :meth:`_predict_chunks`)."""
        buckets = self._lanes[lane]
        bucket = buckets.get(size)
        if bucket is None:
            started = time.perf_counter()
            bucket = self._new_bucket(size)
            buckets[size] = bucket
            if self.graphs:
                self._record(bucket)
            logger.info(
                "model %s on GPU %d: batch bucket %d ready (%s) in %.0f ms",
                self.layout.model, self.device_id, size,
                "CUDA graphs" if self.graphs else "eager", 1e3 * (time.perf_counter() - started),
            )  # fmt: skip
        return bucket

    def _new_bucket(self, size: int) -> _Bucket:
        lay = BatchLayout(
            size, self.placement.keys_per_sample, len(self.placement.slot_table), len(self.feeds),
            self.layout.dense_dim,
        )  # fmt: skip
        staging = _pinned(lay.nbytes, np.uint8)
        staging[:] = 0  # no samples, empty bags: what the graphs are recorded with
        scores_host = _pinned(size * self.layout.label_dim, np.float32).reshape(size, -1)
        inputs = cupy.zeros(lay.nbytes, dtype=cupy.uint8)
        embeddings = cupy.zeros(size * self.placement.out_per_sample, dtype=cupy.float32)
        given = self._given(embeddings, size)
        capacity = size * self.placement.keys_per_sample
        rows = cupy.zeros(max(capacity, 1), dtype=cupy.uint64)
        bucket = _Bucket(
            lay, staging, inputs, embeddings, given, rows, scores_host, cupy.cuda.MemoryPool()
        )
        if self._lower:
            bucket.pending = cupy.zeros(max(capacity, 1) * PENDING_DTYPE.itemsize, cupy.uint8)
            bucket.pending_count = cupy.zeros(1, dtype=cupy.uint64)
        return bucket

    def _given(self, embeddings: Any, size: int) -> dict[str, Any]:
        """The executor's inputs that live in ``embeddings`` (float32 views): each table's
        ``[B, S_t, D_t]`` output (a strided view when a Concat of all of them is fed instead)
        and that Concat's output."""
        given = {}
        if self._concat is not None:
            dim = self.feeds[0].vec_size
            stacked = embeddings.reshape(size, -1, dim)
            given[self._concat] = stacked
            at = 0
            for f in self.feeds:
                given[self._tops[f.layer]] = stacked[:, at : at + f.slot_num]
                at += f.slot_num
            return given
        for f, p in zip(self.feeds, self.placement.tables, strict=True):
            start = size * p.out_at
            region = embeddings[start : start + size * f.slot_num * f.vec_size]
            given[self._tops[f.layer]] = region.reshape(size, f.slot_num, f.vec_size)
        return given

    def _record(self, bucket: _Bucket) -> None:
        """Run the bucket once eagerly (compiles kernels, fills its memory pool), then record
        its graphs (no dense one for a batch-dependent network, whose dense step runs eagerly
        on the real samples: there are none yet)."""
        self._run(bucket, dense=not self.executor.batch_dependent)
        for stream in (self._stream, self._cache_stream, self._prefix_stream):
            stream.synchronize()
        # Free the eager run's outputs, so the captures reuse their pool blocks: a capture
        # cannot grow the pool.
        bucket.scores = bucket.prefix = None
        lookups, row_lookups = (
            tuple(
                _captured(self._cache_stream, bucket.pool, lambda p=p: self._lookup(bucket, p))
                for p in parts
            )
            for parts in (
                self.placement.parts(bucket.layout.size, _grouped(bucket)),
                self.placement.row_parts(bucket.layout.size, _grouped(bucket)),
            )
        )
        insert = _captured(self._cache_stream, bucket.pool, lambda: self._insert(bucket))
        prefix = dense = None
        if self._has_prefix:  # before the dense graph, which reads the prefix's outputs
            prefix = _captured(self._prefix_stream, bucket.pool, lambda: self._prefix_step(bucket))
        if not self.executor.batch_dependent:  # else its shapes follow each batch
            dense = _captured(self._stream, bucket.pool, lambda: self._dense_step(bucket))
        bucket.graphs = _Graphs(lookups, row_lookups, insert, prefix, dense)

    def table_counters(self) -> Sequence[Any]:
        """Device counters per model table (one copy from the GPU), for metrics."""
        if self._bank is None:
            return []
        return self._bank.table_counters()

    def close(self) -> None:
        """Drop the graphs and buffers and release the host mappings."""
        with self._lock:
            if self._bank is not None:
                with cupy.cuda.Device(self.device_id):
                    for stream in (self._stream, self._cache_stream, self._prefix_stream):
                        stream.synchronize()
                self._bank.close()
                self._bank = None
            for buckets in self._lanes:
                buckets.clear()
            if self._copy_pool is not None:
                self._copy_pool.shutdown()
                self._copy_pool = None


def _grouped(bucket: _Bucket) -> bool:
    return bucket.layout.size >= _GROUPED_STAGING_SAMPLES


def _copy_all(copies: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    for target, source in copies:
        target[...] = source


def _captured(stream: Any, pool: Any, launch: Any) -> Any:
    """``launch()`` recorded on ``stream`` as a CUDA graph, allocating from ``pool``, and
    uploaded to the device."""
    with stream, cupy.cuda.using_allocator(pool.malloc):
        stream.begin_capture(_CAPTURE_THREAD_LOCAL)
        try:
            launch()
        finally:
            graph = stream.end_capture()
    graph.upload(stream)
    stream.synchronize()
    return graph


def _pinned(count: int, dtype: Any) -> np.ndarray:
    """A NumPy array in page-locked host memory (fast, asynchronous copies)."""
    dtype = np.dtype(dtype)
    memory = cupy.cuda.alloc_pinned_memory(max(count, 1) * dtype.itemsize)
    return np.frombuffer(memory, dtype, count)
