"""A ranking model on one GPU: a batch of samples in, scores out, in one pass over the GPU.

Per batch the host validates nothing on the device and waits for the GPU once:

1. the batch is copied into a pinned staging buffer laid out as its device twin
   (:mod:`~hps_core.infer.gpu.staging`: the keys of every table, their CSR row offsets as int32
   unless a table has a fixed hotness, the dense features), padded to a size bucket (the
   buffers and graphs of each size: :mod:`~hps_core.infer.gpu.buckets`); a batch that keeps
   its request's ``[B, K]`` key matrix (every table of a fixed hotness) is staged as it is,
   in one copy, sample-major;
2. host-to-device copies of it: one for a small batch; for a large one, one per group of
   tables (or of samples, sample-major), each launched as soon as threads have filled that
   part of the staging buffer (steps 1-2, and the copy in place of a batch already on the
   GPU: :mod:`~hps_core.infer.gpu.uploads`), unless the large batches of its size ran faster
   staged whole, as small ones are (a large batch with few keys:
   :data:`~hps_core.infer.gpu.schedule._STAGED_IN_PARTS`);
3. the lookup of every table (for a large table-major batch, of each group of tables right
   after its group's copy, so the lookup of a group overlaps the filling and copying of the
   next): ``bank_find`` finds each key's row, key by key (cache probe, host-tier row index,
   default vector for unknown keys; each missed row copied once per batch into GPU staging
   rows, however often the batch repeats its key), then ``bank_pool`` pools each bag's rows
   in registers straight into the dense network's input (the output of the Concat of all
   embeddings when the network has one), one launch for a part's slots whatever their
   hotness (:class:`~hps_core.infer.gpu.placement.PoolPlan`);
4. ``bank_insert``: the staged misses go into the dynamic caches, on the GPU (see below for
   when);
5. the dense network (:meth:`~hps_core.nn.DenseExecutor.forward_given`: cuBLASLt products
   with the bias and ReLU in their epilogues, the dot interaction in one kernel); its steps
   that read the dense features alone (DLRM's bottom MLP,
   :meth:`~hps_core.nn.DenseExecutor.forward_dense_prefix`) run on a stream of their own as
   soon as the dense features are on the device, beside the lookup. A large sample-major host
   batch may be scored part by part of its samples instead (where the bucket's batches timed
   both ways ran faster so: ``schedule._DENSE_BY_PART``): each part's whole dense network runs
   as soon as its lookup is done, while the next part is copied (on a copy stream) and looked
   up; the steps themselves are :mod:`~hps_core.infer.gpu.kernel_steps`';
6. one device-to-host copy of the scores (one per part, scored by parts); the only
   synchronisation.

Steps 3, 4, the dense-only steps and 5-6 are each recorded once per bucket as CUDA graphs
(batch sizes are padded to the next power of two; padded samples have no keys and their
scores are dropped), so a batch costs a few graph launches (two per part of its lookup)
however many tables and layers the model has. The graphs' intermediate tensors live in a
memory pool of their own, which nothing else uses.

Steps 3-4 run on the pipeline's cache stream inside the caches' ordering section
(:meth:`CacheBank.section`), so other streams and, for shared caches, other processes never see
a half-done insert. Within step 3 of a batch looked up in parts, each part's pooling runs on a
pool stream of its own after that part's ``bank_find``, beside the next part's (the finds wait
on the host's memory, whose rows cross PCIe, the poolings on the GPU's; how much they overlap
on the H200: docs/BENCHMARKS_HISTORY.md), and the cache stream waits for the last pooling
before it leaves the section. The dense network waits for the lookup only. With caches of its
own, the insert waits for the scores and runs while the host stages the next batch (beside the
dense network it cost 3-13% of a batch on the H200); with caches shared between processes it
runs at once, beside the dense network (on the main stream, of higher priority), since the
other processes' next lookups wait for it. The next batch's lookup comes after the insert on
the cache stream.

A model whose tables have tiers below the host tier (Redis, RocksDB, an update overlay with
new keys) waits once more per batch while those tiers may hold rows: between steps 2 and 3,
the keys that neither a cache nor a host tier holds are fetched through the host
(:mod:`~hps_core.infer.gpu.lower_tiers`); such a batch's lookup follows its whole copy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import cupy
import numpy as np

from hps_core.cuda import kernels
from hps_core.infer.gpu.bank import CacheBank
from hps_core.infer.gpu.buckets import (
    Bucket,
    Graphs,
    LookupGraphs,
    captured,
    grouped,
    in_parts_by_default,
    new_bucket,
)
from hps_core.infer.gpu.chunks import chunk_samples
from hps_core.infer.gpu.constants import bank_defines
from hps_core.infer.gpu.kernel_steps import KernelSteps
from hps_core.infer.gpu.lower_tiers import LowerTierFetch
from hps_core.infer.gpu.placement import Part, Placement
from hps_core.infer.gpu.schedule import BucketSchedules, ScheduleTrial
from hps_core.infer.gpu.staging import bucket_for
from hps_core.infer.gpu.uploads import DENSE_FEATURES, STAGING_GROUPS, BatchUploader, copy_all
from hps_core.infer.inputs.batch import SparseBatch
from hps_core.infer.inputs.layout import RankingLayout, TableFeed
from hps_core.lookup.model_lookup import ModelLookup
from hps_core.nn import DenseExecutor

logger = logging.getLogger("hps_core")

_INSERT_AFTER_SCORES = True
"""Launch the insert after the dense network, not beside it (caches of its own only)."""
_CHUNK_LANES = 2
"""Buckets per chunk size: a chunk is staged into one while the GPU works on the other's."""
_POOL_BESIDE_FIND = True
"""Pool each part's bags on the pool stream beside the next part's ``bank_find`` (``False``:
after it, on the cache stream)."""
_POOL_PRIORITY = -1
"""The pool stream's priority: above the cache stream's (0), meant to let the previous part's
pooling take the SMs as a part's ``bank_find`` blocks retire, before the next find's blocks
fill them (below the main stream's, whose dense network comes first). Measured at f73a47c
against 0: within the noise either way (docs/BENCHMARKS_HISTORY.md)."""
_ROW_PARTS = True
"""Look a large sample-major host batch up by ranges of samples, each as soon as it is copied
(``False``: after its whole copy, by groups of tables). DLRM-v2, 16,384 fresh samples, 0.2
cache, TF32 on the H200 (e2a9b18): by groups of tables its lookup took 4.54 ms against 5.60,
but the batch 11.07 ms against 9.53, waiting for the whole copy."""
_HIGHEST_PRIORITY = -1000  # lower is more urgent; 0 is the default and least urgent


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
        self._concat = executor.embedding_concat()
        # The embeddings pooled straight into a later Concat's output (DLRM-v2's, beside the
        # bottom MLP's output) when its rows stay 16-byte aligned: that Concat then copies its
        # other inputs only (at 16,384 samples a copy of 226 MB less per batch).
        pooled = executor.pooled_concat
        if pooled is not None and (pooled.width % 4 or pooled.at % 4):
            pooled = None
        self._pooled_concat = pooled
        self.placement = Placement.of(
            layout, self.feeds, self._concat is not None, STAGING_GROUPS,
            concat_row=(pooled.width, pooled.at) if pooled else None,
        )  # fmt: skip
        # The pooled tensors the dense network reads (the others are given only so that the
        # steps making them are skipped): an FP16 network casts these alone.
        given = {*self._tops.values(), *([self._concat] if self._concat else [])}
        given |= {pooled.output, pooled.flat} if pooled else set()
        self._read_given = executor.reads_of_given(given)
        self._bank: CacheBank | None = None
        self._steps: KernelSteps | None = None  # made with the bank
        self._lower = False  # a table has tiers below its host tier (set with the bank)
        # Buckets by size, per lane: lane 0 serves every batch, the others chunked ones.
        self._lanes: list[dict[int, Bucket]] = [{} for _ in range(_CHUNK_LANES)]
        self._buckets = self._lanes[0]
        # Sizes that stage in parts by default may also have a bucket that stages whole, and a
        # trial between the two (see _run_large).
        self._whole_buckets: dict[int, Bucket] = {}
        self._schedules = BucketSchedules(layout.model, self.device_id)
        self._lock = threading.Lock()
        with cupy.cuda.Device(self.device_id):
            # The main stream (copies, dense network) outranks the cache stream (lookup and
            # insert), so the dense network's blocks go first while an insert runs beside it.
            # CUDA clamps a priority into the device's range.
            self._stream = cupy.cuda.Stream(non_blocking=True, priority=_HIGHEST_PRIORITY)
            self._cache_stream = cupy.cuda.Stream(non_blocking=True, priority=0)
            # The dense-only steps (a bottom MLP) run beside the lookup on a stream of their own.
            self._prefix_stream = cupy.cuda.Stream(non_blocking=True, priority=_HIGHEST_PRIORITY)
            # A chunk of a chunked batch is copied here, beside the last chunk's dense network.
            self._copy_stream = cupy.cuda.Stream(non_blocking=True, priority=_HIGHEST_PRIORITY)
            # Each part's pooling runs here, beside the next part's bank_find.
            self._pool_stream = cupy.cuda.Stream(non_blocking=True, priority=_POOL_PRIORITY)
            self._pooled = cupy.cuda.Event(disable_timing=True)
            self._pools_pending = False  # poolings launched there since the last join
            self._prefixed = cupy.cuda.Event(disable_timing=True)
            self._dense_uploaded = cupy.cuda.Event(disable_timing=True)
            self._uploaded = [
                cupy.cuda.Event(disable_timing=True)
                for _ in range(max(len(self.placement.group_slots), STAGING_GROUPS))
            ]
            self._found = [cupy.cuda.Event(disable_timing=True) for _ in self._uploaded]
            self._part_pooled = [cupy.cuda.Event(disable_timing=True) for _ in self._uploaded]
            self._looked_up = cupy.cuda.Event(disable_timing=True)
            self._chunk_done = [cupy.cuda.Event(disable_timing=True) for _ in range(_CHUNK_LANES)]
            self._scored = cupy.cuda.Event(disable_timing=True)
            self._bank_kernels = kernels.module("bank", self.device_id, defines=bank_defines())
            self._uploader = BatchUploader(
                layout.model, self.device_id, self.placement, self._stream
            )
            self._lower_tiers = LowerTierFetch(
                self._stream, self._cache_stream, self._uploaded[0], self._bank_kernels
            )

    @property
    def _streams(self) -> tuple[Any, ...]:
        return (
            self._stream, self._cache_stream, self._pool_stream, self._prefix_stream,
            self._copy_stream,
        )  # fmt: skip

    @property
    def bank(self) -> CacheBank:
        """The device state of the tables (opened on first use)."""
        if self._bank is None:
            bank = CacheBank(self.lookup, [p.table for p in self.placement.tables])
            try:
                with cupy.cuda.Device(self.device_id):
                    self._steps = KernelSteps(
                        bank, self.placement, self.executor, self._read_given, self._stream,
                        self._bank_kernels, bucket_for(self.layout.max_batch_size),
                    )  # fmt: skip
                    # Those fills and copies ran on the caller's stream, which the pipeline's
                    # non-blocking streams do not wait for: finish them before the first
                    # lookup.
                    cupy.cuda.get_current_stream().synchronize()
            except BaseException:
                # Its host mappings stay registered otherwise, and the next try would map
                # the same memory again (which CUDA refuses).
                bank.close()
                raise
            self._lower = any(bank.lower)
            self._bank = bank
        return self._bank

    @property
    def steps(self) -> KernelSteps:
        """The GPU work of a batch, step by step (made when the bank opens)."""
        self.bank  # noqa: B018 - opens the bank, which makes the steps
        assert self._steps is not None
        return self._steps

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
            self._uploader.check_device_batch(batch)
        size = bucket_for(max(samples, self._samples_for_keys(batch)))
        with self._lock, cupy.cuda.Device(self.device_id):
            bank = self.bank
            # Tables whose lower tiers may hold rows (RocksDB, Redis, an update overlay with
            # new keys) cost a host round trip per batch; the others never do (one more fetch
            # clears the extra rows a last fetch left).
            fetch = self._lower and (
                self._lower_tiers.extras is not None or bank.lower_may_answer()
            )
            on_host = not isinstance(batch.dense, cupy.ndarray)
            chunk = self._chunk_samples(batch) if on_host and not fetch else None
            if chunk is not None:
                scores = self._predict_chunks(batch, chunk)
                bank.batches += 1
                return scores
            bucket = self._bucket(size)
            by_rows = on_host and self._uploader.sample_major(batch)
            if grouped(bucket) and on_host and not fetch and (_ROW_PARTS or not by_rows):
                bucket = self._run_large(bucket, batch, by_rows)
            else:
                self._uploader.stage_and_upload(bucket, batch)
                if fetch:
                    steps = self.steps
                    self._lower_tiers.fetch(
                        bucket, bank, steps.descriptors, steps.descriptor_rows,
                        steps.slot_table, steps.slot_local,
                    )  # fmt: skip
                self._run(bucket)
            self._stream.synchronize()
            bank.batches += 1
            bucket.batches += 1
            return bucket.scores_host[:samples].copy()

    def _run_large(self, bucket: Bucket, batch: SparseBatch, by_rows: bool) -> Bucket:
        """A host batch in a bucket that stages in parts (``schedule._STAGED_IN_PARTS``): run in
        parts, or whole in the bucket of the same size that stages whole; returns the bucket
        that ran it. The two are timed against each other once the bucket's choice between
        scoring whole and by parts (:meth:`_by_part_trial`), if it has one, is made."""
        trial = self._schedules.staging(bucket.layout.size, bucket.layout.keys_bytes)
        inner = self._by_part_trial(bucket) if by_rows else None
        ready = trial is not None and (inner is None or inner.chosen is not None)
        in_parts = trial.next() if ready else True
        ran = bucket if in_parts else self._bucket(bucket.layout.size, whole=True)
        started = time.perf_counter()
        if not in_parts:
            self._uploader.stage_and_upload(ran, batch)
            self._run(ran)
        elif by_rows:
            self._run_rows(bucket, batch)
        else:
            self._run(bucket, self._uploader.upload_groups(bucket, batch))
        # A bucket's first batch pays one-time costs: it is not timed.
        if ready and trial.chosen is None and ran.batches > 0:
            self._record_trial(trial, in_parts, started, bucket, "stages", "in parts")
        return ran

    def _record_trial(
        self, trial: ScheduleTrial, schedule: bool, started: float, bucket: Bucket, verb: str,
        parts_name: str,
    ) -> None:  # fmt: skip
        """Record a timed batch of ``trial`` that ran by ``schedule`` since ``started``, once
        the GPU is done (:meth:`BucketSchedules.record`)."""
        self._stream.synchronize()
        seconds = time.perf_counter() - started
        self._schedules.record(trial, schedule, seconds, bucket.layout.size, verb, parts_name)

    def schedules_chosen(self) -> bool:
        """Whether every bucket has chosen how it stages and scores large host batches (their
        first batches time both ways of each choice: :class:`ScheduleTrial`)."""
        return self._schedules.chosen()

    def staged_whole(self, size: int) -> bool:
        """Whether host batches of bucket size ``size`` now run staged whole in the second
        bucket of that size (see ``schedule._STAGED_IN_PARTS``)."""
        return self._schedules.staged_whole(size)

    def scored_by_part(self, size: int) -> bool | None:
        """Whether sample-major host batches of bucket size ``size`` are now scored part by
        part (None: not chosen yet, or only whole applies)."""
        bucket = self._buckets.get(size)
        return None if bucket is None or bucket.by_part is None else bucket.by_part.chosen

    def _run_rows(self, bucket: Bucket, batch: SparseBatch) -> None:
        """A sample-major host batch in a grouped bucket, looked up part by part of its rows
        as each is copied, and scored whole or part by part (its copies then on the copy
        stream, so that a part is scored while the next one is copied and looked up)."""
        trial = self._by_part_trial(bucket)
        by_part = trial.next() if trial is not None else False
        started = time.perf_counter()
        copy = self._copy_stream if by_part else None
        parts = self._uploader.upload_rows(bucket, batch, copy, by_part)
        self._run(bucket, parts, by_rows=True, copied=copy, dense_by_part=by_part)
        # A bucket's first batch pays one-time costs: it is not timed.
        if trial is not None and trial.chosen is None and bucket.batches > 0:
            self._record_trial(trial, by_part, started, bucket, "scores", "by parts")

    def _chunk_samples(self, batch: SparseBatch) -> int | None:
        """Samples per chunk of a host batch run as chunks, or None to run it whole
        (:func:`~hps_core.infer.gpu.chunks.chunk_samples`)."""
        key_bytes = sum(int(k.nbytes) for k in batch.keys)
        return chunk_samples(
            key_bytes, batch.batch_size, self.executor.batch_dependent,
            self.steps.has_dynamic_caches,
        )  # fmt: skip

    def _predict_chunks(self, batch: SparseBatch, chunk: int) -> np.ndarray:
        """Scores of a host batch run as chunks of ``chunk`` samples, each a batch of its own
        (its lookup, insert and dense network, as :meth:`predict` runs them) on buckets of
        two lanes: while the GPU scores chunk ``i``, the host stages chunk ``i + 1`` into the
        other lane's bucket, and it waits only before reusing a lane, for the chunk that last
        used it. Chunks see the caches as successive batches would."""
        samples = batch.batch_size
        scores = np.empty((samples, self.layout.label_dim), np.float32)
        in_flight: dict[int, tuple[Bucket, int]] = {}  # lane: (its bucket, first sample)

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
            # Its copy runs on the copy stream and its insert right after its lookup, so the
            # next chunk's copy and lookup run beside this chunk's dense network.
            copy = self._copy_stream
            self._uploader.stage_and_upload(bucket, part, threaded=False, stream=copy)
            self._run(bucket, copied=copy, insert_at_once=True)
            self._chunk_done[lane].record(self._stream)
            bucket.batches += 1
            in_flight[lane] = (bucket, first)
        for lane in list(in_flight):
            collect(lane)
        return scores

    def _samples_for_keys(self, batch: SparseBatch) -> int:
        """Samples whose key capacity holds every table's keys (multi-hot requests may carry
        more keys per sample than ``maxnum_catfeature_query_per_table_per_sample``)."""
        need = 0
        for f in self.feeds:
            n = int(batch.keys[f.table].size)
            need = max(need, -(-n // max(f.max_keys_per_sample, 1)))
        return need

    def _run(
        self,
        bucket: Bucket,
        uploaded: Iterable[int] | None = None,
        dense: bool = True,
        by_rows: bool = False,
        copied: Any = None,
        insert_at_once: bool = False,
        dense_by_part: bool = False,
    ) -> None:
        """Lookups and insert on the cache stream, the dense network and the download on the
        main stream after the lookups (see the module docstring).

        Args:
            bucket: the batch's bucket.
            uploaded: None when the main stream holds the copy of the whole batch (every
                lookup follows it); else, for a grouped bucket, yields each group of tables
                once the main stream holds its copy (that group's lookup follows the copy),
                then ``DENSE_FEATURES`` once it holds the dense features (the dense-only steps
                follow). The lookups and the insert of a batch are one ordering section: with
                caches shared between processes, another process's lookups and inserts never
                fall between those of this batch's groups (which would make every group's
                lookup wait for the other process's latest work).
            dense: ``False``: the lookups and insert only.
            by_rows: ``uploaded`` yields parts of :meth:`Placement.row_parts` (a sample-major
                batch in a grouped bucket), not groups of tables.
            copied: the stream that holds the batch's copies (default: the main stream).
            insert_at_once: launch the insert right after the lookup even where it would
                otherwise wait for the scores (a chunk: the next chunk's lookup follows it).
            dense_by_part: with ``by_rows``, score each part (its dense network and download,
                on the main stream) as soon as its lookup is done; ``uploaded`` then copies
                each part's dense features with its keys (see :meth:`_by_part_trial`).
        """
        main, cache = self._stream, self._cache_stream
        parts = (
            self._row_parts(bucket)
            if by_rows
            else self.placement.parts(bucket.layout.size, grouped(bucket))
        )
        failed: Exception | None = None  # a part's dense step, raised once the insert is queued
        with cache, self.bank.section():
            for group in uploaded or ():
                if group == DENSE_FEATURES:
                    self._dense_uploaded.record(copied or main)
                    self._launch_prefix(bucket, self._dense_uploaded)
                    continue
                self._uploaded[group].record(copied or main)
                cache.wait_event(self._uploaded[group])
                self._launch_lookup(bucket, group, parts[group], by_rows)
                if dense and dense_by_part and failed is None:
                    try:
                        self._launch_part_dense(bucket, group, parts[group])
                    except Exception as error:  # the other parts' lookups still run
                        failed = error
            if uploaded is None:
                self._uploaded[0].record(copied or main)
                self._launch_prefix(bucket, self._uploaded[0])
                cache.wait_event(self._uploaded[0])
                self._launch_lookups(bucket)
            self._join_pools()
            self._looked_up.record(cache)
            # With caches of its own, the insert waits for the scores: it then runs while the
            # host stages the next batch rather than beside the dense network. Caches shared
            # with other processes take it at once, since their next lookups wait for it.
            deferred = (
                dense
                and _INSERT_AFTER_SCORES
                and self.lookup.cache_group is None
                and not insert_at_once
            )
            if not deferred:
                self._launch_insert(bucket)
        main.wait_event(self._looked_up)
        if self.steps.has_prefix and not dense_by_part:
            main.wait_event(self._prefixed)
        if not dense:
            return
        try:
            if failed is not None:
                raise failed
            if dense_by_part:
                pass  # every part is scored already (_launch_part_dense)
            elif bucket.graphs is not None:
                bucket.graphs.dense.launch(main)
            else:
                with main, cupy.cuda.using_allocator(bucket.pool.malloc):
                    self.steps.dense(bucket)
        finally:
            # Even after a failed dense step: the insert also empties the batch's miss sets,
            # which the next batch's lookup must find empty.
            if deferred:
                self._scored.record(main)
                with cache, self.bank.section():
                    cache.wait_event(self._scored)
                    self._launch_insert(bucket)

    def _by_part_trial(self, bucket: Bucket) -> ScheduleTrial | None:
        """How a sample-major host batch in ``bucket`` chooses between scoring it whole and
        part by part of its rows (see ``schedule._DENSE_BY_PART``), or None where only whole
        applies: a bucket that is not grouped, or a network whose layers take statistics over
        the batch."""
        if self.executor.batch_dependent or not self._row_parts(bucket):
            return None
        # Lane 0's buckets count in schedules_chosen(). Decided when the trial is made (the
        # first call), so _bucket() must have stored the bucket before its first batch runs.
        serving = self._buckets.get(bucket.layout.size) is bucket
        return self._schedules.scoring(bucket, counted=serving)

    def _row_parts(self, bucket: Bucket) -> tuple[Part, ...]:
        return self.placement.row_parts(bucket.layout.size, grouped(bucket))

    def _launch_part_dense(self, bucket: Bucket, index: int, part: Part) -> None:
        """Part ``index``'s dense network and download on the main stream, after its pooling
        (launched last by :meth:`_launch_lookup` on the pool or cache stream)."""
        main = self._stream
        pooled = self._part_pooled[index]
        pooled.record(self._pool_stream if self._pools_pending else self._cache_stream)
        main.wait_event(pooled)
        if bucket.graphs is not None and bucket.graphs.row_dense:
            bucket.graphs.row_dense[index].launch(main)
        else:
            with main, cupy.cuda.using_allocator(bucket.pool.malloc):
                self.steps.part_dense(bucket, index, part)

    def _launch_insert(self, bucket: Bucket) -> None:
        if bucket.graphs is not None:
            bucket.graphs.insert.launch(self._cache_stream)
        else:
            self.steps.insert(bucket)

    def _launch_lookup(self, bucket: Bucket, index: int, part: Part, by_rows: bool = False) -> None:
        """Part ``index``'s ``bank_find`` on the cache stream (the current one), then its
        pooling, on the pool stream after the find (see the module docstring)."""
        cache = self._cache_stream
        graphs = None
        if bucket.graphs is not None:
            graphs = (bucket.graphs.row_lookups if by_rows else bucket.graphs.lookups)[index]
            graphs.find.launch(cache)
        else:
            self.steps.find(bucket, part)
        pool = cache
        if _POOL_BESIDE_FIND and grouped(bucket):  # a bucket of one part has nothing beside
            pool = self._pool_stream
            self._found[index].record(cache)
            pool.wait_event(self._found[index])
            self._pools_pending = True
        if graphs is not None:
            graphs.pool.launch(pool)
        else:
            with pool:
                self.steps.pool(bucket, part)

    def _launch_lookups(self, bucket: Bucket) -> None:
        """Every part's lookup of a batch the device holds whole, joined on the cache stream
        (the current one)."""
        for index, part in enumerate(self.placement.parts(bucket.layout.size, grouped(bucket))):
            self._launch_lookup(bucket, index, part)
        self._join_pools()

    def _join_pools(self) -> None:
        """The cache stream waits for the poolings launched on the pool stream, if any."""
        if self._pools_pending:
            self._pooled.record(self._pool_stream)
            self._cache_stream.wait_event(self._pooled)
            self._pools_pending = False

    def _launch_prefix(self, bucket: Bucket, uploaded: Any) -> None:
        """The dense-only steps on the prefix stream, after the event ``uploaded`` (the main
        stream holds the dense features)."""
        if not self.steps.has_prefix:
            return
        stream = self._prefix_stream
        stream.wait_event(uploaded)
        if bucket.graphs is not None and bucket.graphs.prefix is not None:
            bucket.graphs.prefix.launch(stream)
        else:
            with stream, cupy.cuda.using_allocator(bucket.pool.malloc):
                self.steps.prefix(bucket)
        self._prefixed.record(stream)

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
                self._uploader.check_device_batch(batch)
            head, groups = self._uploader.stage(bucket, batch, on_device)
            if not on_device:  # the host's part is not timed
                for copies in (head, *groups):
                    copy_all(copies)

            def upload(b: Bucket) -> None:
                if not on_device:
                    used = b.layout.used_bytes(self._uploader.has_offsets(batch))
                    self._uploader.upload(b, 0, used)
                    return
                self._uploader.upload_head(b, batch)
                for copies in (head, *groups):
                    copy_all(copies)

            steps = self.steps
            timed = {
                "upload": upload,
                "lookup": steps.lookup,
                "insert": steps.insert,
                "forward": steps.forward,
                "download": steps.download,
            }
            events = [cupy.cuda.Event() for _ in range(len(timed) + 1)]
            events[0].record(self._stream)
            with self.bank.section(), cupy.cuda.using_allocator(bucket.pool.malloc):
                for step, event in zip(timed.values(), events[1:], strict=True):
                    step(bucket)
                    event.record(self._stream)
            events[-1].synchronize()
            return {
                name: cupy.cuda.get_elapsed_time(start, stop)
                for name, start, stop in zip(timed, events[:-1], events[1:], strict=True)
            }

    # -- buckets ------------------------------------------------------------------------------

    def _bucket(self, size: int, lane: int = 0, whole: bool = False) -> Bucket:
        """The bucket of ``size`` samples (made and recorded on first use) of ``lane``: lanes
        other than 0 hold the further buckets of chunked batches (see :meth:`_predict_chunks`);
        with ``whole``, for a size that stages in parts by default, lane 0's bucket of that
        size that stages whole instead (see :meth:`_run_large`)."""
        whole = whole and in_parts_by_default(size)
        buckets = self._whole_buckets if whole else self._lanes[lane]
        bucket = buckets.get(size)
        if bucket is None:
            started = time.perf_counter()
            # Its buffers are zeroed on the main stream, before the uploads into them: on the
            # caller's stream (the legacy default one, which the pipeline's non-blocking
            # streams do not wait for) an eager first batch could have its inputs zeroed
            # after they were copied (graphs synchronise first, eager launches do not).
            with self._stream:
                bucket = new_bucket(
                    size, self.layout, self.placement, self._concat, self._tops, self._lower,
                    self._pooled_concat, in_parts=False if whole else None,
                )  # fmt: skip
            buckets[size] = bucket
            if self.graphs:
                self._record(bucket)
            logger.info(
                "model %s on GPU %d: batch bucket %d%s ready (%s) in %.0f ms",
                self.layout.model, self.device_id, size, " (staged whole)" if whole else "",
                "CUDA graphs" if self.graphs else "eager", 1e3 * (time.perf_counter() - started),
            )  # fmt: skip
        return bucket

    def _record(self, bucket: Bucket) -> None:
        """Run the bucket once eagerly (compiles kernels, fills its memory pool), then record
        its graphs."""
        self._run(bucket)
        steps = self.steps
        row_parts = self._row_parts(bucket)
        # A bucket that may score by parts runs the parts' shapes too, before any capture
        # (cuBLASLt tunes on first use).
        scored_by_parts = self._by_part_trial(bucket) is not None
        if scored_by_parts:
            with self._stream, cupy.cuda.using_allocator(bucket.pool.malloc):
                for index, part in enumerate(row_parts):
                    steps.part_dense(bucket, index, part)
        for stream in self._streams:
            stream.synchronize()
        # Free the eager run's outputs, so the captures reuse their pool blocks: a capture
        # cannot grow the pool.
        bucket.scores = bucket.prefix = None
        bucket.part_scores.clear()
        lookups, row_lookups = (
            tuple(
                LookupGraphs(
                    captured(self._cache_stream, bucket.pool, lambda p=p: steps.find(bucket, p)),
                    captured(self._pool_stream, bucket.pool, lambda p=p: steps.pool(bucket, p)),
                )
                for p in parts
            )
            for parts in (
                self.placement.parts(bucket.layout.size, grouped(bucket)),
                self._row_parts(bucket),
            )
        )
        insert = captured(self._cache_stream, bucket.pool, lambda: steps.insert(bucket))
        prefix = None
        if self.steps.has_prefix:  # before the dense graph, which reads the prefix's outputs
            prefix = captured(self._prefix_stream, bucket.pool, lambda: steps.prefix(bucket))
        dense = captured(self._stream, bucket.pool, lambda: steps.dense(bucket))
        # Each part's graph keeps its scores' block; their other tensors may share blocks with
        # the other parts' and the whole dense graph's, since all run on the main stream.
        row_dense = tuple(
            captured(self._stream, bucket.pool, lambda i=i, p=p: steps.part_dense(bucket, i, p))
            for i, p in enumerate(row_parts if scored_by_parts else ())
        )
        bucket.graphs = Graphs(lookups, row_lookups, insert, prefix, dense, row_dense)

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
                    for stream in self._streams:
                        stream.synchronize()
                self._bank.close()
                self._bank = None
                self._steps = None  # holds the closed bank's device arrays
            self._drop_buckets()
            self._uploader.close()

    def _drop_buckets(self) -> None:
        """Forget every bucket and the trials between them (made again on next use)."""
        for buckets in (*self._lanes, self._whole_buckets):
            buckets.clear()
        self._schedules.clear()
