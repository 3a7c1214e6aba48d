"""Choose and open the host tiers a ps.json asks for.

The volatile database types of HugeCTR that keep tables in host memory (``hash_map``,
``parallel_hash_map``, ``multi_process_hash_map``) all map to :class:`SharedHostTable`: under
Triton's Python backend one shared copy per machine is what each of them is for. Tiers that
later work adds (Redis cluster, RocksDB, an update source) parse today and fail here, when a
model is opened, with a message saying so.
"""

from __future__ import annotations

import logging

from hps_core.config import DatabaseType, PSConfig, TableConfig, UpdateSourceType
from hps_core.errors import NotAvailableError
from hps_core.tiers.host_table import SharedHostTable

logger = logging.getLogger("hps_core")

_SHARED_MEMORY_TYPES = frozenset(
    {
        DatabaseType.HASH_MAP,
        DatabaseType.PARALLEL_HASH_MAP,
        DatabaseType.MULTI_PROCESS_HASH_MAP,
    }
)


def check_tiers_available(config: PSConfig) -> None:
    """Raise if the ps.json needs a tier this version cannot serve.

    Args:
        config: the parsed ps.json.

    Raises:
        NotAvailableError: naming the ps.json field and the value that is not available yet.
    """
    volatile = config.volatile_db.type
    if volatile not in _SHARED_MEMORY_TYPES and volatile != DatabaseType.DISABLED:
        raise NotAvailableError(
            f"volatile_db.type: '{volatile.value}' is not available yet; use 'hash_map', "
            "'parallel_hash_map' or 'multi_process_hash_map' (one shared-memory copy per machine)"
        )
    if config.persistent_db.type != DatabaseType.DISABLED:
        raise NotAvailableError(
            f"persistent_db.type: '{config.persistent_db.type.value}' is not available yet; "
            "remove the persistent_db section or set its type to 'disabled'"
        )
    if config.update_source.type != UpdateSourceType.NULL:
        raise NotAvailableError(
            f"update_source.type: '{config.update_source.type.value}' is not available yet; "
            "set it to 'null'"
        )


def open_host_table(config: PSConfig, table: TableConfig) -> SharedHostTable:
    """Open (building once per machine) the host-memory copy of one table.

    ``volatile_db.type: disabled`` still gets the shared copy: without a persistent tier
    there is nowhere else to read the table from.

    Args:
        config: the parsed ps.json.
        table: the table to open.

    Returns:
        The attached shared table.
    """
    check_tiers_available(config)
    if config.volatile_db.initial_cache_rate < 1.0:
        logger.warning(
            "volatile_db.initial_cache_rate=%s ignored: without a persistent tier the host "
            "tier holds every row",
            config.volatile_db.initial_cache_rate,
        )
    return SharedHostTable(table.sparse_file, table.dim, table.default_value)
