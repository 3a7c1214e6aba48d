"""Keys to embedding vectors for every table of one model.

Today the vectors come from the shared host tier; the GPU embedding cache slots in here
(between the keys and the host tier) without changing the callers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hps_core.config import ModelConfig, PSConfig
from hps_core.errors import RequestError
from hps_core.tiers.factory import open_host_table
from hps_core.tiers.host_table import SharedHostTable


@dataclass
class TableStats:
    """Counters of one table's lookups since the session opened.

    Args:
        lookups: calls that touched the table.
        keys: keys looked up.
        unknown_keys: keys the table does not hold (answered with the default vector).
    """

    lookups: int = 0
    keys: int = 0
    unknown_keys: int = 0


class ModelLookup:
    """Embedding lookup for one model of a ps.json.

    Tables are opened on first use, each at most once, so the first request pays for loading
    the tables it touches (HugeCTR's implicit initialisation).

    Args:
        config: the whole ps.json (the tiers are configured at its top level).
        model: the model to serve.
    """

    def __init__(self, config: PSConfig, model: ModelConfig) -> None:
        self.config = config
        self.model = model
        self._tables: list[SharedHostTable | None] = [None] * len(model.tables)
        self._lock = threading.Lock()
        self.stats = [TableStats() for _ in model.tables]

    @property
    def num_tables(self) -> int:
        """Number of embedding tables of the model."""
        return len(self.model.tables)

    def table(self, table_id: int) -> SharedHostTable:
        """The host-tier table ``table_id``, opened on first use.

        Args:
            table_id: index of the table in ``sparse_files``.

        Returns:
            The shared table.
        """
        if not 0 <= table_id < self.num_tables:
            raise RequestError(
                f"table_id {table_id} out of range: model '{self.model.name}' has "
                f"{self.num_tables} tables"
            )
        table = self._tables[table_id]
        if table is None:
            with self._lock:
                table = self._tables[table_id]
                if table is None:
                    table = open_host_table(self.config, self.model.tables[table_id])
                    self._tables[table_id] = table
        return table

    def open_all(self) -> None:
        """Open every table now instead of on first use."""
        for table_id in range(self.num_tables):
            self.table(table_id)

    def lookup(self, table_id: int, keys: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Embedding vectors of ``keys`` in table ``table_id``.

        Args:
            table_id: index of the table.
            keys: int64 keys (any shape is flattened).
            out: optional float32 ``[n, dim]`` array to write into.

        Returns:
            float32 ``[n, dim]``; the table's default vector for unknown keys.
        """
        values, found = self.table(table_id).lookup(keys, out)
        stats = self.stats[table_id]
        stats.lookups += 1
        stats.keys += len(found)
        stats.unknown_keys += int(len(found) - np.count_nonzero(found))
        return values

    def lookup_tables(self, keys_per_table: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Look up one key array per table.

        Args:
            keys_per_table: ``num_tables`` int64 arrays.

        Returns:
            One float32 ``[n_t, dim_t]`` array per table.
        """
        if len(keys_per_table) != self.num_tables:
            raise RequestError(
                f"got keys for {len(keys_per_table)} tables, model '{self.model.name}' has "
                f"{self.num_tables}"
            )
        return [self.lookup(t, keys) for t, keys in enumerate(keys_per_table)]

    def close(self) -> None:
        """Detach from every opened table."""
        with self._lock:
            for table in self._tables:
                if table is not None:
                    table.close()
            self._tables = [None] * self.num_tables
