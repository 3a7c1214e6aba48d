"""A batch into its bucket's device input buffer, from the host or from other device arrays.

A host batch is written into the bucket's pinned staging buffer (laid out as
:mod:`~hps_core.infer.gpu.staging` describes) and copied to the device on the pipeline's main
stream: in one copy for a small batch; for a large one, part by part (groups of tables, or
ranges of samples of a sample-major batch), each part's copy queued as soon as threads have
filled it, so that the part's lookup can start while the next part is filled. A batch of
CuPy arrays is copied in place on the GPU, its contiguous arrays in one ``copy_spans`` launch.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator, Sequence
from typing import Any

import cupy
import numpy as np

from hps_core.cuda import kernels
from hps_core.cuda.structs import SPAN_DTYPE
from hps_core.errors import RequestError
from hps_core.infer.gpu.buckets import Bucket, grouped, pinned
from hps_core.infer.gpu.placement import Placement
from hps_core.infer.gpu.staging import split_copies
from hps_core.infer.inputs.batch import SparseBatch

_H2D = cupy.cuda.runtime.memcpyHostToDevice
_COPY_THREADS = 256
_COPY_BLOCKS = 64
"""Most blocks per span of ``copy_spans`` (16 bytes per thread and step)."""
_THREADED_STAGING_BYTES = 4 << 20
"""From this many bytes of keys on, threads fill each group (NumPy copies release the GIL)."""
STAGING_GROUPS = 8
"""Most parts (groups of tables, ranges of samples) a large batch is copied and looked up in."""
DENSE_FEATURES = -1
"""Yielded by :meth:`BatchUploader.upload_rows` and :meth:`BatchUploader.upload_groups`, after
every part's index, once the copy of the dense features is queued."""
_STAGING_THREADS = 4
_STAGING_PIECE_BYTES = 4 << 20
"""A threaded fill of a whole batch (or chunk) hands the threads about this many bytes at a
time, queueing each piece's copy as soon as it is filled: a thread-pool round trip per piece
(eight pieces of each 7 MB chunk made DLRM-v2's chunked batch slower than one thread)."""


class BatchUploader:
    """Stages the batches of one pipeline and copies them into their bucket's device input
    buffer on its main stream; owns the threads that fill the staging buffers and the span
    table of ``copy_spans``. Make it on its GPU (inside ``cupy.cuda.Device(device_id)``).

    Args:
        model: the model's name (in the staging threads' names and in errors).
        device_id: the pipeline's GPU.
        placement: where the model's tables sit in a batch.
        stream: the pipeline's main stream, on which every copy is queued.
    """

    def __init__(self, model: str, device_id: int, placement: Placement, stream: Any) -> None:
        self._model = model
        self._device_id = device_id
        self._placement = placement
        self._stream = stream
        self._copy_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._copy_spans = kernels.module("copy", device_id).get_function("copy_spans")
        # A batch on the device has one key array per table, offsets for each multi-hot
        # one, and its dense features.
        spans = 1 + 2 * len(placement.feeds)
        self._spans_host = pinned(spans, SPAN_DTYPE)
        self._spans_device = cupy.empty(spans * SPAN_DTYPE.itemsize, dtype=cupy.uint8)

    def check_device_batch(self, batch: SparseBatch) -> None:
        """Check that a batch handed over on the GPU has every array on this GPU.

        Args:
            batch: a batch whose dense features are a CuPy array.

        Raises:
            RequestError: an array is not a CuPy array, or is on another GPU.
        """
        arrays = [batch.dense, *batch.keys, *(o for o in batch.row_offsets if o is not None)]
        for array in arrays:
            if not isinstance(array, cupy.ndarray):
                raise RequestError(
                    "a batch on the GPU needs every array on the GPU (dense, keys, offsets)"
                )
            if array.device.id != self._device_id:
                raise RequestError(
                    f"the batch is on GPU {array.device.id}; model '{self._model}' runs "
                    f"on GPU {self._device_id}"
                )

    def sample_major(self, batch: SparseBatch) -> bool:
        """Whether the batch's keys are staged as its ``[B, K]`` request matrix (one copy):
        it keeps one, and its columns are exactly every table's key room (its hotness is the
        samples contract's, which fills every table's room)."""
        keys = batch.sample_keys
        return (
            keys is not None
            and self._placement.sample_hotness is not None
            and batch.hotness == self._placement.sample_hotness
            and keys.ndim == 2
            and keys.shape[1] == self._placement.keys_per_sample
            and keys.strides[1] == keys.itemsize
        )

    def stage_and_upload(
        self, bucket: Bucket, batch: SparseBatch, threaded: bool = True, stream: Any = None
    ) -> None:
        """Fill the staging buffer and copy it to the device on the main stream; a batch
        already on the device is copied in place there instead, after the header. Threads
        fill large host batches unless ``threaded`` is False.

        Args:
            bucket: the batch's bucket.
            batch: host arrays, or CuPy arrays on this GPU (checked by
                :meth:`check_device_batch`).
            threaded: let threads fill a host batch with many keys.
            stream: the stream a host batch is copied on instead of the main stream (which
                then waits for nothing of it: the caller orders its readers after it).
        """
        lay = bucket.layout
        if isinstance(batch.dense, cupy.ndarray):
            head, groups = self.stage(bucket, batch, on_device=True)
            # The caller's stream may still be writing the arrays (DLPack's contract: the
            # consumer orders itself after the producer's stream).
            caller = cupy.cuda.get_current_stream()
            if caller.ptr != self._stream.ptr:
                self._stream.wait_event(caller.record())
            # Header and padded offsets from the host, then the batch's own arrays over the
            # rest of their regions, in stream order.
            self.upload_head(bucket, batch)
            with self._stream:
                self._gather_on_device([c for copies in (head, *groups) for c in copies])
            return
        if grouped(bucket) and not self.sample_major(batch):
            for _ in self.upload_groups(bucket, batch):
                pass
            return
        head, groups = self.stage(bucket, batch, on_device=False)
        copy_all(head)
        keys = [c for copies in groups for c in copies]
        nbytes = sum(t.nbytes for t, _ in keys)
        used = lay.used_bytes(self.has_offsets(batch))
        if nbytes < _THREADED_STAGING_BYTES or not threaded:
            copy_all(keys)
            self.upload(bucket, 0, used, stream)
            return
        # Many keys: threads fill the staging buffer part by part, each part's copy to the
        # device queued as soon as it is filled (a sample-major batch is one run of bytes).
        self.upload(bucket, lay.header_at, used, stream)
        for part in split_copies(keys, max(1, nbytes // _STAGING_PIECE_BYTES)):
            list(self._copier().map(copy_all, split_copies(part, _STAGING_THREADS)))
            for target, _ in part:
                start = target.ctypes.data - bucket.staging.ctypes.data
                self.upload(bucket, start, start + target.nbytes, stream)

    def _gather_on_device(self, copies: Sequence[tuple[Any, Any]]) -> None:
        """:func:`copy_all` for CuPy arrays, on the current (main) stream: the copies whose
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

    def upload_rows(
        self, bucket: Bucket, batch: SparseBatch, stream: Any = None, dense_by_part: bool = False
    ) -> Iterator[int]:
        """Stage and copy a sample-major host batch part by part of its samples (see
        :meth:`Placement.row_parts`): the header (one copy), each part's rows of the key
        matrix (filled by threads), then the dense features, or with ``dense_by_part`` each
        part's dense features with its keys.

        Args:
            bucket: the batch's bucket (a grouped one).
            batch: host arrays whose keys are staged sample-major (see :meth:`sample_major`).
            stream: the stream the copies are queued on (default: the main stream).
            dense_by_part: copy each part's dense features with its keys (its scores are then
                computed part by part).

        Yields:
            Each part's index once its copy is queued, then (without ``dense_by_part``)
            ``DENSE_FEATURES``.
        """
        lay = bucket.layout
        head, groups = self.stage(bucket, batch, on_device=False)
        (target, source), samples = groups[0][0], batch.batch_size
        (dense_target, dense_source) = head[0]
        self.upload(bucket, lay.header_at, lay.dense_at, stream)  # sample-major: no offsets
        row_bytes, dense_bytes = lay.keys_per_sample * 8, lay.dense_dim * 4
        parts = self._placement.row_parts(bucket.layout.size, grouped(bucket))
        for index, (_, _, (first, stop)) in enumerate(parts):
            a, b = min(first, samples), min(stop, samples)
            if b > a:
                copies = [(target[a:b], source[a:b])]
                if copies[0][0].nbytes >= _THREADED_STAGING_BYTES // STAGING_GROUPS:
                    list(self._copier().map(copy_all, split_copies(copies, _STAGING_THREADS)))
                else:
                    copy_all(copies)
                self.upload(bucket, a * row_bytes, b * row_bytes, stream)
                if dense_by_part:
                    dense_target[a:b] = dense_source[a:b]
                    at = lay.dense_at
                    self.upload(bucket, at + a * dense_bytes, at + b * dense_bytes, stream)
            yield index
        if not dense_by_part:
            copy_all(head)
            self.upload(bucket, lay.dense_at, lay.offsets_at, stream)
            yield DENSE_FEATURES

    def upload_groups(self, bucket: Bucket, batch: SparseBatch) -> Iterator[int]:
        """Stage and copy a table-major host batch in the order the GPU needs it: the header
        and the row offsets if any, each group's keys (filled by threads), then the dense
        features, which the lookups do not read.

        Args:
            bucket: the batch's bucket (a grouped one).
            batch: host arrays whose keys are staged table-major.

        Yields:
            Each group's index once its copy is queued on the main stream, then
            ``DENSE_FEATURES``.
        """
        lay = bucket.layout
        head, groups = self.stage(bucket, batch, on_device=False)
        dense, offsets = head[:1], head[1:]
        copy_all(offsets)
        self.upload_head(bucket, batch)
        threaded = sum(t.nbytes for g in groups for t, _ in g) >= _THREADED_STAGING_BYTES
        for group, ((first, last), copies) in enumerate(
            zip(self._placement.group_keys, groups, strict=True)
        ):
            if threaded:
                list(self._copier().map(copy_all, split_copies(copies, _STAGING_THREADS)))
            else:
                copy_all(copies)
            # A copy per group, however small: the lookup of each group starts as soon as the
            # host has filled it. Copies of 2 MB or more (several groups each) ran at 35 GB/s
            # instead of 24 but made the one-hot DLRM's 16,384 samples 0.2 ms slower from the
            # host (H200, 7f2d63d), its lookups waiting for the host's later groups.
            self.upload(bucket, lay.size * 8 * first, lay.size * 8 * last)
            yield group
        copy_all(dense)
        self.upload(bucket, lay.dense_at, lay.offsets_at)
        yield DENSE_FEATURES

    def stage(
        self, bucket: Bucket, batch: SparseBatch, on_device: bool
    ) -> tuple[list[tuple[Any, Any]], list[list[tuple[Any, Any]]]]:
        """Write the header and the padded samples' offsets into the staging buffer; return
        the copies that fill the rest of the staging buffer, or of the device input buffer
        for a batch on the device.

        Args:
            bucket: the batch's bucket (its ``samples`` is set to the batch's).
            batch: host arrays, or CuPy arrays on this GPU.
            on_device: the batch is on the device (its copies target the input buffer).

        Returns:
            ``(target, source)`` pairs for the header region (the dense features first, then
            the row offsets) and for the keys: of each group of tables (table-major), or one
            list holding the batch's whole key matrix (sample-major, see
            :meth:`sample_major`).

        Raises:
            RequestError: the dense features are not ``[batch, dense_dim]``.
        """
        lay = bucket.layout
        keys, _, offsets, dense = bucket.input_views if on_device else bucket.staging_views
        _, header, host_offsets, _ = bucket.staging_views
        samples = batch.batch_size
        if batch.dense.shape != (samples, lay.dense_dim):
            raise RequestError(
                f"dense features must be [batch, {lay.dense_dim}], got {batch.dense.shape}"
            )
        header[0] = samples
        bucket.samples = samples
        head = [(dense[:samples], batch.dense)]
        if self.sample_major(batch):
            header[1] = 1
            header[2:] = self._placement.sample_hotness
            matrix = keys.reshape(lay.size, lay.keys_per_sample)
            return head, [[(matrix[:samples], batch.sample_keys)]]
        header[1] = 0
        groups: list[list[tuple[Any, Any]]] = [[] for _ in self._placement.group_keys]
        for u, (f, p) in enumerate(zip(self._placement.feeds, self._placement.tables, strict=True)):
            table_keys = batch.keys[f.table]
            hot = batch.table_hotness(f.table)
            header[2 + u] = hot or 0
            start = lay.size * p.keys_at
            target = keys[start : start + table_keys.size]
            groups[self._placement.table_group[u]].append(
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

    def has_offsets(self, batch: SparseBatch) -> bool:
        """Whether a table of the batch has row offsets (else none are copied)."""
        return any(batch.row_offsets[f.table] is not None for f in self._placement.feeds)

    def upload_head(self, bucket: Bucket, batch: SparseBatch) -> None:
        """Copy the header, and the row offsets if the batch has any, to the device."""
        lay = bucket.layout
        self.upload(bucket, lay.header_at, lay.dense_at)
        if self.has_offsets(batch):
            self.upload(bucket, lay.offsets_at, lay.nbytes)

    def upload(self, bucket: Bucket, start: int, stop: int, stream: Any = None) -> None:
        """Copy bytes ``[start, stop)`` of the staging buffer to the device, on ``stream``
        (default: the main stream)."""
        cupy.cuda.runtime.memcpyAsync(
            bucket.inputs.data.ptr + start, bucket.staging.ctypes.data + start, stop - start,
            _H2D, (stream or self._stream).ptr,
        )  # fmt: skip

    def _copier(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._copy_pool is None:
            self._copy_pool = concurrent.futures.ThreadPoolExecutor(
                _STAGING_THREADS, thread_name_prefix=f"hps-stage-{self._model}"
            )
        return self._copy_pool

    def close(self) -> None:
        """Stop the staging threads (a later threaded fill starts new ones)."""
        if self._copy_pool is not None:
            self._copy_pool.shutdown()
            self._copy_pool = None


def copy_all(copies: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    """Copy each ``(target, source)`` pair: NumPy arrays, or CuPy arrays (on the current
    stream)."""
    for target, source in copies:
        target[...] = source
