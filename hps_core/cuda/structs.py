"""NumPy mirrors of the structs the CUDA kernels read and write, field for field.

Kept apart from the modules that launch the kernels so that they import without CuPy: the
unit test ``tests/unit/cuda/test_cuda_structs.py`` compiles the structs with nvcc and compares
every offset and size with these dtypes. Change a struct and its mirror together.
"""

from __future__ import annotations

import numpy as np

TABLE_DTYPE = np.dtype(
    [
        ("cache_keys", "<u8"),
        ("cache_stamps", "<u8"),
        ("cache_values", "<u8"),
        ("locks", "<u8"),
        ("index_hashes", "<u8"),
        ("index_starts", "<u8"),
        ("index_positions", "<u8"),
        ("values", "<u8"),
        ("extra_keys", "<u8"),
        ("extra_values", "<u8"),
        ("miss_keys", "<u8"),
        ("miss_rows", "<u8"),
        ("staging", "<u8"),
        ("cache_sets", "<u8"),
        ("extra_count", "<i8"),
        ("keys_at", "<i8"),
        ("offsets_at", "<i8"),
        ("out_at", "<i8"),
        ("out_shift", "<i8"),
        ("out_stride", "<i8"),
        ("miss_slots", "<i8"),
        ("staging_rows", "<i8"),
        ("slot_num", "<i4"),
        ("dim", "<i4"),
        ("bucket_bits", "<i4"),
        ("starts64", "<i4"),
        ("combiner", "<i4"),
        ("host_values", "<i4"),
        ("default_value", "<f4"),
        ("keys_cap", "<i4"),
        ("lower", "<i4"),
        ("row_words", "<i4"),
        ("storage", "<i4"),
        ("pad", "<i4"),
    ]
)
"""``struct Table`` of ``kernels/bank.cu``."""

MISS_DTYPE = np.dtype(
    [("key", "<i8"), ("src", "<u8"), ("slot", "<i8"), ("table", "<i4"), ("insert", "<i4")]
)
"""``struct Miss`` of ``kernels/bank.cu``: a key of the batch's miss set of its table."""

PENDING_DTYPE = np.dtype([("key", "<i8"), ("table", "<i4"), ("pad", "<i4")])
"""``struct Pending`` of ``kernels/bank.cu``: a key for the tiers below the host tier."""

SPAN_DTYPE = np.dtype([("src", np.uint64), ("dst", np.uint64), ("nbytes", np.int64)])
"""A byte span to copy on the GPU: ``struct Span`` of ``kernels/copy.cu``."""
