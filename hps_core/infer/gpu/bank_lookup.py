"""Embedding lookups of a model's tables on one GPU through the cache bank's kernels: the
engine behind every GPU lookup of a :class:`~hps_core.lookup.ModelLookup` (``HPS.lookup``,
``lookup_fromdlpack``, ``hps_torch`` and the ``KEYS``/``NUMKEYS`` contract), the same
``bank_find`` / ``bank_pool`` / ``bank_insert`` the ranking pipeline runs.

A lookup is a batch of bags whose pooled rows are the answer:

- unpooled (a row per key): every key is a bag of one key, copied as a row by ``bank_pool``;
- pooled with a fixed hotness ``h``: bag ``i`` holds keys ``[i * h, (i + 1) * h)``;
- pooled with CSR offsets: bag ``i`` holds keys ``[offsets[i], offsets[i + 1])``.

Each table of the model is one slot of one sample per bag: a lookup of ``n`` bags is a batch
of ``n`` samples (the bucket: the next power of two), in which the tables a call does not ask
for have no key room. Keys on the host are staged in pinned memory and copied once; keys on
the GPU are copied in place. ``bank_find`` finds every key's row (GPU cache, host tier read in
place over PCIe, the tiers below it through the host, default vector), copying each missed
row once per call into the table's staging rows; ``bank_pool`` writes the answer (straight
into the caller's array when one table is asked for); ``bank_insert`` then puts the misses
into the dynamic caches, after the answer, on the engine's stream: no call waits for its
insert, so every miss is answered with its true row and cached, whatever the batch's hit rate
(HugeCTR's ``hit_rate_threshold`` has nothing left to choose: see
:func:`hps_core.config.inert`).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from hps_core.cuda import kernels
from hps_core.errors import RequestError
from hps_core.infer.gpu.bank import CacheBank
from hps_core.infer.gpu.buckets import Bucket, new_bucket
from hps_core.infer.gpu.constants import bank_defines
from hps_core.infer.gpu.kernel_steps import KernelSteps
from hps_core.infer.gpu.lower_tiers import LowerTierFetch
from hps_core.infer.gpu.placement import Placement
from hps_core.infer.gpu.staging import bucket_for
from hps_core.infer.gpu.uploads import BatchUploader
from hps_core.infer.inputs.batch import SparseBatch
from hps_core.infer.inputs.layout import RankingLayout, TableFeed
from hps_core.lookup.model_lookup import ModelLookup, TableQuery, check_out
from hps_core.lookup.table_lookup import TableCounters
from hps_core.nn import Combiner

logger = logging.getLogger("hps_core")

_ROW_ALIGNMENT = 16
"""Bytes ``bank_pool`` aligns its row stores to (where a width is a multiple of 4 floats)."""


@dataclass
class _Shape:
    """The kernels' view of one shape of call (key room and combiner of every table) in a
    bucket of ``size`` bags: its placement, steps, buffers and lower-tier fetch."""

    placement: Placement
    steps: KernelSteps
    uploader: BatchUploader
    bucket: Bucket
    fetch: LowerTierFetch | None
    staging_ptrs: tuple[int, ...]  # the bank's staging rows the steps' descriptors point at


class BankLookup:
    """The GPU lookup engine of one model lookup (see the module docstring): made by
    :func:`hps_core.hps.gpu_engine` on the lookup's first GPU lookup; the lookup counts its
    lookups and closes it.

    Args:
        lookup: the model's lookup on a GPU.

    Example:
        >>> engine = BankLookup(model_lookup)  # doctest: +SKIP
        >>> (rows,) = engine.lookup([TableQuery(0, cupy.asarray(keys))])  # doctest: +SKIP
    """

    def __init__(self, lookup: ModelLookup) -> None:
        if lookup.device_id is None:
            raise ValueError("the GPU lookup engine needs a model lookup on a GPU")
        self.model_lookup = lookup
        self.device_id = lookup.device_id
        self._lock = threading.Lock()
        self._bank: CacheBank | None = None
        self._shapes: dict[tuple[Any, ...], _Shape] = {}
        self._dims = tuple(t.dim for t in lookup.model.tables)
        with cupy.cuda.Device(self.device_id):
            self._stream = cupy.cuda.Stream(non_blocking=True)
            self._answered = cupy.cuda.Event(disable_timing=True)
            self._uploaded = cupy.cuda.Event(disable_timing=True)
            self._kernels = kernels.module("bank", self.device_id, defines=bank_defines())

    @property
    def bank(self) -> CacheBank:
        """The device state of every table of the model (opened on first use)."""
        if self._bank is None:
            with cupy.cuda.Device(self.device_id):
                self._bank = CacheBank(self.model_lookup, range(self.model_lookup.num_tables))
        return self._bank

    def lookup(self, queries: Sequence[TableQuery], outs: Sequence[Any] | None = None) -> list[Any]:
        """Answer ``queries`` (at most one per table) in one batch of the bank's kernels.

        Args:
            queries: what to look up, keys all on the host or all on this GPU.
            outs: per query, a float32 C-contiguous ``[bags, dim]`` CuPy array on this GPU to
                write the answer into, or None.

        Returns:
            Per query, float32 CuPy ``[bags, dim]`` on this GPU (``outs[i]`` when given). The
            caller's current stream waits for the answer.

        Raises:
            RequestError: a table asked twice, keys or offsets that do not fit, arrays on
                another GPU.
        """
        if not queries:
            return []
        outs = list(outs) if outs is not None else [None] * len(queries)
        return self._run(queries, outs, None)

    def lookup_side_by_side(self, queries: Sequence[TableQuery], out: Any) -> Any:
        """Answer ``queries`` into the columns of one array, in the order asked: what a
        ``torch.cat(answers, dim=1)`` of :meth:`lookup` holds, written by ``bank_pool``
        itself (no answer per table, no copy).

        Args:
            queries: at most one per table, in rising table order, of equal bags, each table's
                width a multiple of 4 (every row of ``out`` stays 16-byte aligned): see
                :meth:`side_by_side`.
            out: float32 C-contiguous ``[bags, sum of widths]`` CuPy array on this GPU.

        Returns:
            ``out``, which the caller's current stream waits for.

        Raises:
            RequestError: queries that cannot be answered side by side, ``out`` that does not
                fit, keys or offsets that do not fit, arrays on another GPU.
        """
        if not self.side_by_side(queries):
            raise RequestError(
                "side by side: the queries must ask rising tables of widths that are multiples "
                "of 4, for equal numbers of bags"
            )
        check_out(out, queries[0].bags, sum(self._dims[q.table] for q in queries), self.device_id)
        if out.data.ptr % _ROW_ALIGNMENT:
            # bank_pool stores 16 bytes at a time: a view off that alignment gets a copy.
            aligned = self._run(queries, [None] * len(queries), cupy.empty_like(out))[0]
            out[...] = aligned
            return out
        return self._run(queries, [None] * len(queries), out)[0]

    def side_by_side(self, queries: Sequence[TableQuery]) -> bool:
        """Whether :meth:`lookup_side_by_side` answers ``queries``: tables asked in rising
        order, each once, every width a multiple of 4, every query of the same bags."""
        tables = [q.table for q in queries]
        return (
            bool(queries)
            and all(a < b for a, b in itertools.pairwise(tables))
            and all(self._dims[t] % 4 == 0 for t in tables)
            and len({q.bags for q in queries}) == 1
        )

    def _run(self, queries: Sequence[TableQuery], outs: list[Any], side: Any) -> list[Any]:
        """One batch of the kernels for ``queries``: into ``outs`` (per query), or with
        ``side`` every answer into that one array's columns."""
        on_device = isinstance(queries[0].keys, cupy.ndarray)
        tables = [q.table for q in queries]
        if len(set(tables)) != len(tables):
            raise RequestError("a lookup asks each table at most once")
        by_table = dict(zip(tables, queries, strict=True))
        rooms = tuple(
            (by_table[t].key_room(), by_table[t].combiner) if t in by_table else (0, None)
            for t in range(self.model_lookup.num_tables)
        )
        bags = max(q.bags for q in queries)
        # Room for every key: a table's keys fill at most `size * key room` positions.
        need = max(-(-int(q.keys.shape[0]) // rooms[q.table][0]) for q in queries)
        size = bucket_for(max(bags, need, 1))
        with self._lock, cupy.cuda.Device(self.device_id):
            shape = self._shape(rooms, size, side is not None)
            batch = self._batch(queries, bags, on_device)
            caller = cupy.cuda.get_current_stream()
            if on_device:
                shape.uploader.check_device_batch(batch)
            shape.uploader.stage_and_upload(shape.bucket, batch, threaded=True)
            if shape.fetch is not None and (
                shape.fetch.extras is not None or self.bank.lower_may_answer()
            ):
                steps = shape.steps
                shape.fetch.fetch(
                    shape.bucket, self.bank, steps.descriptors, steps.descriptor_rows,
                    steps.slot_table, steps.slot_local,
                )  # fmt: skip
            self._checked_outs(queries, outs)
            direct = side if side is not None else self._direct_output(queries, outs)
            stream = self._stream
            with stream, self.bank.section():
                shape.steps.find(shape.bucket)
                if direct is not None:
                    part = ((0, shape.placement.keys_per_sample), (0, shape.placement.slots),
                            (0, bags))  # fmt: skip
                    shape.steps.pool(shape.bucket, part, out=direct)
                    answers = [direct]
                else:
                    shape.steps.pool(shape.bucket)
                    answers = self._answers(shape, queries, outs, size)
                self._answered.record(stream)
                # After the answer: nothing waits for it but the next call's lookup.
                shape.steps.insert(shape.bucket)
            self.bank.batches += 1
            caller.wait_event(self._answered)
            return answers

    def _checked_outs(self, queries: Sequence[TableQuery], outs: Sequence[Any]) -> None:
        """Refuse an output array that does not fit its query's answer."""
        for q, out in zip(queries, outs, strict=True):
            if out is not None:
                check_out(out, q.bags, self._dims[q.table], self.device_id)

    def _direct_output(self, queries: Sequence[TableQuery], outs: Sequence[Any]) -> Any:
        """The array ``bank_pool`` writes into for a call of one table: the caller's ``out``,
        or a new one; None for a call of several tables, which are pooled into the bucket
        first (each table's answer then starts a bucket's rows apart; side by side, see
        :meth:`lookup_side_by_side`, they share one array instead)."""
        if len(queries) != 1:
            return None
        q, out = queries[0], outs[0]
        if out is None:
            return cupy.empty((q.bags, self._dims[q.table]), dtype=cupy.float32)
        # bank_pool stores 16 bytes at a time: a view off that alignment is copied into.
        return None if out.data.ptr % _ROW_ALIGNMENT else out

    def _answers(
        self, shape: _Shape, queries: Sequence[TableQuery], outs: Sequence[Any], size: int
    ) -> list[Any]:
        """Each query's rows out of the bucket, into the given or new arrays (on the engine's
        stream, after the pooling)."""
        embeddings = shape.bucket.embeddings
        answers = []
        for q, out in zip(queries, outs, strict=True):
            dim = self._dims[q.table]
            start = size * shape.placement.tables[q.table].out_at
            region = embeddings[start : start + q.bags * dim].reshape(q.bags, dim)
            if out is None:
                answers.append(region.copy())
            else:
                out[...] = region
                answers.append(out)
        return answers

    def _batch(self, queries: Sequence[TableQuery], bags: int, on_device: bool) -> SparseBatch:
        """The call as a batch of ``bags`` samples: per table, its keys and offsets (CSR
        offsets padded with empty bags where the table has fewer bags than the batch), or no
        key at all for a table the call does not ask for."""
        xp = cupy if on_device else np
        by_table = {q.table: q for q in queries}
        keys, offsets, hotness = [], [], []
        for t in range(self.model_lookup.num_tables):
            q = by_table.get(t)
            if q is None:
                keys.append(xp.empty(0, xp.int64))
                offsets.append(None)
                hotness.append(1)
                continue
            k = q.keys
            if k.dtype != xp.int64 or k.ndim != 1:
                raise RequestError(f"table {t}: keys must be 1-D int64, got {k.dtype} {k.shape}")
            keys.append(k)
            hot = 1 if q.combiner is None else q.hotness
            if q.combiner is not None and q.offsets is not None:
                o = q.offsets.astype(xp.int32, copy=False)
            elif q.bags == bags:
                offsets.append(None)
                hotness.append(int(hot or 1))
                continue
            else:  # fewer bags than the batch: its bags as offsets
                o = xp.arange(0, int(k.shape[0]) + 1, int(hot or 1), dtype=xp.int32)
            if o.shape[0] < bags + 1:
                o = xp.concatenate([o, xp.full(bags + 1 - o.shape[0], o[-1], dtype=xp.int32)])
            offsets.append(o)
            hotness.append(1)
        dense = xp.empty((bags, 0), dtype=xp.float32)
        return SparseBatch(dense, tuple(keys), tuple(offsets), tuple(hotness))

    def _shape(
        self, rooms: tuple[tuple[int, Combiner | None], ...], size: int, side: bool
    ) -> _Shape:
        """The kernels' view of a call shape in a bucket of ``size`` bags, its tables' answers
        side by side in one output or each in its own (made on first use; made again where a
        later shape grew the bank's staging rows it points at)."""
        bank = self.bank
        key = (rooms, size, side)
        shape = self._shapes.get(key)
        if shape is not None and shape.staging_ptrs == bank.staging_pointers():
            return shape
        names = [t.name for t in self.model_lookup.model.tables]
        feeds = tuple(
            TableFeed(
                t,
                names[t],
                f"t{t}",
                1 if room else 0,
                self._dims[t],
                combiner or Combiner.SUM,
                room,
            )
            for t, (room, combiner) in enumerate(rooms)
        )
        layout = RankingLayout(self.model_lookup.model.name, 0, 1, size, feeds)
        # Tables not asked have no slot: side by side, they take no columns.
        placement = Placement.of(layout, feeds, concat=side, groups=1)
        with self._stream:
            bucket = new_bucket(
                size, layout, placement, None, {f.layer: f.layer for f in feeds}, any(bank.lower),
                in_parts=False,
            )  # fmt: skip
            steps = KernelSteps(bank, placement, None, (), self._stream, self._kernels, size)
        uploader = BatchUploader(
            self.model_lookup.model.name, self.device_id, placement, self._stream
        )
        fetch = None
        if any(bank.lower):
            fetch = LowerTierFetch(self._stream, self._stream, self._uploaded, self._kernels)
        self._stream.synchronize()
        shape = _Shape(placement, steps, uploader, bucket, fetch, bank.staging_pointers())
        old = self._shapes.pop(key, None)
        if old is not None:
            old.uploader.close()
        self._shapes[key] = shape
        return shape

    def table_counters(self) -> list[TableCounters]:
        """The bank's counters per model table (none before the first lookup)."""
        if self._bank is None:
            return []
        return self._bank.table_counters()

    def close(self) -> None:
        """Release the buffers and the bank's host mappings."""
        with self._lock:
            if self._bank is not None:
                with cupy.cuda.Device(self.device_id):
                    self._stream.synchronize()
                for shape in self._shapes.values():
                    shape.uploader.close()
                self._shapes.clear()
                self._bank.close()
                self._bank = None
