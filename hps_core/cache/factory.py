"""Choose and build the embedding cache of one table on one device.

``kind`` is ps.json's ``embedding_cache_type``. A dynamic cache is the CUDA cache on the current
device (its NumPy twin, the executable specification of its semantics, is kept with the tests:
no serving path uses a cache in host memory); a static table may be NumPy or CuPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hps_core.cache.dynamic import DynamicCache
from hps_core.cache.layout import num_sets_for
from hps_core.cache.static_table import StaticTable
from hps_core.errors import ConfigError, NotAvailableError, Problem
from hps_core.quant import RowFormat, StoragePrecision

_NOT_IMPLEMENTED_KINDS = ("uvm", "stochastic")


def make_cache(
    kind: str,
    capacity_rows: int,
    dim: int,
    xp: Any = np,
    *,
    name: str = "cache",
    contents: tuple[Any, Any] | None = None,
    sync_checks: bool = False,
    group: Any = None,
    group_index: int = 0,
    precision: StoragePrecision = StoragePrecision.FP32,
) -> DynamicCache | StaticTable:
    """Build a ``dynamic`` (LRU) or ``static`` (whole table) embedding cache.

    Args:
        kind: ``"dynamic"`` or ``"static"`` (an ``EmbeddingCacheType`` member works too).
        capacity_rows: dynamic: rows to hold, rounded up to whole 64-row sets (at least one);
            static: the table's row count, an upper bound on ``len(contents[0])``.
        dim: embedding width.
        xp: ``cupy`` (the current CUDA device); ``numpy`` too for a static table.
        name: label for error messages, e.g. ``"dcn.table0"``.
        contents: static only: ``(keys, values)`` of the whole table, the values stored in
            ``precision`` (:meth:`~hps_core.quant.RowFormat.encode_stored`).
        sync_checks: CuPy dynamic cache only: synchronise after each kernel (tests, debugging).
        group: CuPy dynamic cache only: a :class:`~hps_core.cache.ipc_group.SharedCacheGroup`
            whose processes share the cache's slots, as its table ``group_index``.
        group_index: the table's index in ``group``.
        precision: how the cache stores its rows; ``replace``/``update`` (and ``contents``)
            take rows stored so, queries answer them decoded to float32.

    Returns:
        The cache.

    Raises:
        ConfigError: unknown ``kind``.
        NotAvailableError: a kind HugeCTR has that this package does not implement.
        ValueError: sizes or ``contents`` do not fit the kind.
        TypeError: ``xp`` is neither NumPy nor CuPy, or NumPy for a dynamic cache.

    Example:
        >>> keys, values = np.array([3, 7]), np.ones((2, 16), np.float32)
        >>> make_cache("static", 2, 16, np, contents=(keys, values)).size
        2
    """
    kind_name = str(getattr(kind, "value", kind))
    where = f"cache {name!r}"
    if isinstance(capacity_rows, bool) or not isinstance(capacity_rows, (int, np.integer)):
        raise ValueError(f"{where}: capacity_rows must be an integer, got {capacity_rows!r}")
    if capacity_rows < 0:
        raise ValueError(f"{where}: capacity_rows must not be negative, got {capacity_rows}")
    if xp.__name__ not in ("numpy", "cupy"):
        raise TypeError(f"{where}: xp must be numpy or cupy, got {xp.__name__}")
    if kind_name == "dynamic":
        if contents is not None:
            raise ValueError(f"{where}: a dynamic cache starts empty; contents is for 'static'")
        if xp is np:
            raise TypeError(f"{where}: a dynamic cache lives on a GPU: xp must be cupy")
        from hps_core.cache.cupy_cache import CupyDynamicCache

        return CupyDynamicCache(
            num_sets_for(capacity_rows),
            dim,
            name=name,
            sync_checks=sync_checks,
            group=group,
            group_index=group_index,
            precision=precision,
        )
    if kind_name == "static":
        if contents is None:
            raise ValueError(f"{where}: a static cache needs contents=(keys, values)")
        # FP32 contents carry their width (checked below); stored rows do not.
        fmt = None if precision is StoragePrecision.FP32 else RowFormat(precision, dim)
        table = StaticTable(*contents, xp=xp, name=name, row_format=fmt)
        if table.dim != dim or table.size > capacity_rows:
            raise ValueError(
                f"{where}: contents hold {table.size} rows of width {table.dim}; "
                f"expected at most {capacity_rows} rows of width {dim}"
            )
        return table
    if kind_name in _NOT_IMPLEMENTED_KINDS:
        raise NotAvailableError(f"{where}: embedding_cache_type {kind_name!r} is not implemented")
    raise ConfigError(
        Problem(
            "embedding_cache_type",
            f"unknown cache kind {kind_name!r} for {name!r}; expected 'dynamic' or 'static'",
        )
    )
