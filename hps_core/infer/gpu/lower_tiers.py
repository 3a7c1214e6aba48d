"""Keys that neither a GPU cache nor a host tier holds, fetched through the host from the tiers
below (Redis, RocksDB, an update overlay with new keys).

``bank_probe`` lists such keys of an uploaded batch on the GPU; the host reads the list (the
one round trip such a model pays per batch, and only while its lower tiers may answer: see
:meth:`~hps_core.infer.gpu.bank.CacheBank.lower_may_answer`), asks each table's lower tiers
for its unique keys, and uploads the rows found as each table's sorted extra rows (descriptor
fields ``extra_*``), which ``bank_find`` stages, pools and inserts like the host tier's rows.
A model without lower tiers never comes here.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from hps_core.cache.kernel_consts import LANES, THREADS
from hps_core.cuda.structs import PENDING_DTYPE
from hps_core.infer.gpu.bank import CacheBank
from hps_core.infer.gpu.buckets import Bucket


class LowerTierFetch:
    """The host round trip of a pipeline's batches to its tables' lower tiers, and the extra
    rows it fetched for the batch in flight (:attr:`extras`).

    Args:
        main: the pipeline's main stream (it holds the batch's copy to the device).
        cache: its cache stream (lookup and insert).
        uploaded: an event to record on ``main`` after the batch's copy.
        bank_kernels: the compiled module of ``kernels/bank.cu``.
    """

    def __init__(self, main: Any, cache: Any, uploaded: Any, bank_kernels: Any) -> None:
        self._main, self._cache = main, cache
        self._uploaded = uploaded
        self._bank_kernels = bank_kernels
        self.extras: tuple[Any, Any] | None = None  # the extra rows of the batch in flight

    def fetch(
        self,
        bucket: Bucket,
        bank: CacheBank,
        descriptors: Any,
        rows: np.ndarray,
        slot_table: Any,
        slot_local: Any,
    ) -> None:
        """Fetch, through the host, the keys of the uploaded batch that neither a cache nor a
        host tier holds from the tiers below, and point the descriptors' extra rows at the rows
        found (see the module docstring).

        Args:
            bucket: the batch's bucket (one with room for pending keys).
            bank: the tables' device state.
            descriptors: the tables' device descriptors (``TABLE_DTYPE`` rows, as uint8).
            rows: their host copy, whose ``extra_*`` fields this sets.
            slot_table, slot_local: per slot of a sample, its table's position and its slot
                within that table (device int32, as ``bank_pool`` reads them).
        """
        main, cache = self._main, self._cache
        lay = bucket.layout
        keys, header, offsets, _ = bucket.input_views
        self._uploaded.record(main)
        with cache, bank.section():
            cache.wait_event(self._uploaded)
            bucket.pending_count.fill(0)
            bags = lay.size * lay.slots
            if bags:
                self._bank_kernels.get_function("bank_probe")(
                    (-(-bags * LANES // THREADS),), (THREADS,),
                    (descriptors, slot_table, slot_local, np.int32(0),
                     np.int32(lay.slots), np.int32(lay.keys_per_sample), np.int64(lay.size),
                     keys, header, offsets, bucket.pending, bucket.pending_count,
                     np.uint64(bucket.pending.nbytes // PENDING_DTYPE.itemsize)),
                )  # fmt: skip
            pending_count = bucket.pending_count.get(stream=cache)
        # The probe followed the last batch's insert on the cache stream: once it is done,
        # nothing reads the last batch's extra rows any more.
        cache.synchronize()
        had_extras, self.extras = self.extras is not None, None
        n = min(int(pending_count[0]), bucket.pending.nbytes // PENDING_DTYPE.itemsize)
        rows["extra_keys"] = rows["extra_values"] = rows["extra_count"] = 0
        try:
            if n:
                pending = bucket.pending[: n * PENDING_DTYPE.itemsize].get().view(PENDING_DTYPE)
                self.extras = self._extra_rows(bank, pending, rows)
        except BaseException:
            # A lower tier that cannot answer fails the batch; the descriptors must not keep
            # pointing at the last batch's extra rows, which are freed now.
            if had_extras:
                with cache:
                    descriptors.set(rows.view(np.uint8), stream=cache)
            raise
        if self.extras is not None or had_extras:
            with cache:
                descriptors.set(rows.view(np.uint8), stream=cache)

    def _extra_rows(
        self, bank: CacheBank, pending: np.ndarray, rows: np.ndarray
    ) -> tuple[Any, Any] | None:
        """Look the pending keys up in their tables' lower tiers; upload the rows found, each
        table's keys sorted with its rows 16-byte aligned, and point ``rows`` (the host copy
        of the descriptors) at them. Returns the device buffers (kept until the batch's
        insert has run), or None when no key was found."""
        key_parts: list[np.ndarray] = []
        value_parts: list[np.ndarray] = []
        spans = []  # (position, first key, first word, count)
        at_key = at_word = 0
        for position in np.unique(pending["table"]).tolist():
            table_keys = np.unique(pending["key"][pending["table"] == position])
            values, found = bank.lookup_lower(position, table_keys)
            count = int(found.sum())
            if count == 0:
                continue
            # Stored rows as 32-bit words (the bits of float32 rows, or encoded words).
            words = int(rows[position]["row_words"])
            block = np.zeros(-(-count * words // 4) * 4, np.uint32)
            block[: count * words] = values[found].view(np.uint32).reshape(-1)
            key_parts.append(table_keys[found])
            value_parts.append(block)
            spans.append((position, at_key, at_word, count))
            at_key += count
            at_word += block.shape[0]
        if not spans:
            return None
        with self._cache:  # before the lookup that reads them, on its stream
            keys_d = cupy.asarray(np.concatenate(key_parts))
            values_d = cupy.asarray(np.concatenate(value_parts))
        for position, first_key, first_word, count in spans:
            rows[position]["extra_keys"] = keys_d.data.ptr + 8 * first_key
            rows[position]["extra_values"] = values_d.data.ptr + 4 * first_word
            rows[position]["extra_count"] = count
        return keys_d, values_d
