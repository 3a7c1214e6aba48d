"""Compressed embedding storage: row codecs for FP16, row-wise int8 and FP8 (E4M3) tables.

:class:`~hps_core.quant.rows.RowFormat` fixes the byte layout of one encoded row for a
:class:`~hps_core.quant.rows.StoragePrecision` and encodes / decodes float32 rows to and from
it; :mod:`hps_core.quant.e4m3` holds the FP8 element conversions. The storage tiers (host
tables in shared memory, GPU caches, updates) use these codecs to keep a table compressed
and read it back as float32, so every tier stores the same bytes for the same row; this
package itself holds no tier logic and imports nothing but NumPy.
"""

from hps_core.quant.e4m3 import E4M3_MAX, e4m3_to_float, float_to_e4m3
from hps_core.quant.rows import RowFormat, StoragePrecision

__all__ = ["E4M3_MAX", "RowFormat", "StoragePrecision", "e4m3_to_float", "float_to_e4m3"]
