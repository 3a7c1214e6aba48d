"""Model files: HugeCTR sparse model folders (``key`` + ``emb_vector``) and their checks.

Parquet conversion lives in :mod:`hps_core.formats.parquet` and is not imported here, so
that importing the engine does not import pyarrow.
"""

from hps_core.formats.keys import check_unique_keys, find_duplicate_keys
from hps_core.formats.sparse import (
    SparseChunk,
    SparseTableInfo,
    inspect_sparse_table,
    iter_sparse_table,
    read_sparse_table,
)
from hps_core.formats.sparse_writer import SparseTableWriter, write_sparse_table

__all__ = [
    "SparseChunk",
    "SparseTableInfo",
    "SparseTableWriter",
    "check_unique_keys",
    "find_duplicate_keys",
    "inspect_sparse_table",
    "iter_sparse_table",
    "read_sparse_table",
    "write_sparse_table",
]
