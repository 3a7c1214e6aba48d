"""How many bytes each tier of a ps.json model holds, before anything is loaded.

Used by ``hps check`` (per table and per model) and by the Triton models' metrics
(``hps_tier_bytes``). Every number comes from the sizing function the tier itself allocates
with, so the report and the allocation cannot drift. The tiers in this process store each
table's rows in its storage precision (``TableConfig.storage``, from ``storage_precision``,
``storage_precision_per_table`` or ``fp8_quant``; :class:`~hps_core.quant.rows.RowFormat`
gives the bytes of a row):

- ``host``: the shared host tier's segment in ``/dev/shm``, once per machine whatever the
  number of processes: the :class:`~hps_core.tiers.hash_layout.HashLayout` of
  :func:`hps_core.tiers.host_table.host_layout` in the table's precision (hashes, bucket
  directory, rows of the first ``initial_cache_rate`` of the files' rows below RocksDB, none
  below Redis, every row otherwise); below a Redis cluster without RocksDB, also the index of
  the model files that answer what a lost node held
  (:func:`~hps_core.tiers.file_rows.index_layout`).
- ``gpu_cache``: a dynamic GPU cache, per GPU instance (one per GPU when instances share
  their caches): ``ceil(gpucacheper * rows)`` rounded up to whole sets of 64 slots
  (:func:`~hps_core.cache.layout.cache_capacity_rows`, :func:`~hps_core.cache.layout.num_sets_for`),
  each slot a key, a stamp and a row (:func:`~hps_core.cache.layout.slot_bytes`).
- ``gpu_static``: a static GPU table (``embedding_cache_type: "static"`` or
  ``use_static_table``), per GPU instance: :func:`~hps_core.cache.static_table.static_table_nbytes`.
- ``gpu_index``: the GPU copy of the host tier's row index that the GPU ranking pipeline keeps
  per GPU instance for tables without a static table (:mod:`hps_core.infer.gpu.bank`):
  :attr:`~hps_core.tiers.hash_layout.HashLayout.index_nbytes`. Only models with a
  ``network_file`` (ranking models) run that pipeline.
- ``redis_cluster`` / ``rocks_db``: the payload stored there, an 8-byte key and a row per row
  loaded when the table opens (:func:`~hps_core.tiers.factory.tier_plan`): ``dim`` float32,
  HugeCTR's layout, whatever the table's storage precision (so HugeCTR and this project can
  share them), or with the database's ``store_compressed`` the table's stored row
  (:mod:`hps_core.tiers.encoded_rows`). They live outside this process, and the databases'
  own overhead is not counted.

Not counted: per-cache counters and insert locks (a few bytes per set), the rows a batch's
misses are staged in (sized by the batch, not the table), the update overlay (bounded by
``volatile_db.overflow_margin``), and the alignment a shared cache group adds (under 512 bytes
per table).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hps_core.cache.layout import WAYS, cache_capacity_rows, num_sets_for, slot_bytes
from hps_core.cache.static_table import static_table_nbytes
from hps_core.config import ModelConfig, PSConfig, TableConfig
from hps_core.formats.sparse import inspect_sparse_table
from hps_core.quant import RowFormat, StoragePrecision
from hps_core.tiers.factory import tier_plan
from hps_core.tiers.file_rows import index_layout
from hps_core.tiers.host_table import held_rows, host_layout

_FP32 = StoragePrecision.FP32

MIXED = "mixed"
"""A model's precision when its tables are stored in different precisions."""

IN_PROCESS_TIERS = ("host", "gpu_cache", "gpu_static", "gpu_index")
"""Tiers held in this machine's memory (``host``) or a GPU's (the others)."""

OUTSIDE_TIERS = ("redis_cluster", "rocks_db")
"""Tiers held by other processes (a Redis cluster, a RocksDB database)."""


def payload_bytes(rows: int, dim: int, precision: StoragePrecision = StoragePrecision.FP32) -> int:
    """Payload of ``rows`` rows in a Redis or RocksDB table: per row an 8-byte key and the
    row, ``dim`` float32 in HugeCTR's layout (fp32), else the stored row of ``precision``.

    Example:
        >>> payload_bytes(10, 4), payload_bytes(10, 4, StoragePrecision.FP16)
        (240, 160)
    """
    return rows * (8 + RowFormat(precision, dim).row_bytes)


@dataclass(frozen=True)
class TableFootprint:
    """Bytes each tier holds for one table (see the module docstring for what each counts).

    Attributes:
        index: table index in the model.
        name: table name.
        rows: rows of the sparse files.
        dim: embedding width.
        precision: storage precision of the rows in this process's tiers (``"fp32"``,
            ``"fp16"``, ``"int8"``, ``"fp8"``).
        host: shared host tier, per machine.
        host_rows: rows the host tier holds (``initial_cache_rate`` below a persistent tier).
        gpu_cache: dynamic GPU cache, per GPU instance (0: none).
        gpu_cache_rows: rows the dynamic cache can hold (0: none).
        gpu_static: static GPU table, per GPU instance (0: none).
        gpu_index: GPU copy of the host tier's row index, per GPU instance (0: none).
        redis_cluster: payload in the Redis cluster (None: no such tier).
        rocks_db: payload in RocksDB (None: no such tier).
        outside_precision: precision of the rows each of those tiers holds, by tier name:
            ``"fp32"`` (HugeCTR's layout) unless the database has ``store_compressed``.
    """

    index: int
    name: str
    rows: int
    dim: int
    precision: str
    host: int
    host_rows: int
    gpu_cache: int
    gpu_cache_rows: int
    gpu_static: int
    gpu_index: int
    redis_cluster: int | None
    rocks_db: int | None
    outside_precision: dict[str, str]

    @property
    def gpu(self) -> int:
        """Bytes on each GPU serving the table (cache or static table, and row index)."""
        return self.gpu_cache + self.gpu_static + self.gpu_index

    def tier_bytes(self) -> dict[str, int]:
        """Bytes of every tier the table has (tiers it lacks are left out), by tier name."""
        tiers = {name: getattr(self, name) for name in IN_PROCESS_TIERS}
        tiers = {name: n for name, n in tiers.items() if name == "host" or n}
        for name in OUTSIDE_TIERS:
            if getattr(self, name) is not None:
                tiers[name] = getattr(self, name)
        return tiers

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields (exact byte counts)."""
        return {
            "index": self.index,
            "name": self.name,
            "rows": self.rows,
            "dim": self.dim,
            "precision": self.precision,
            "host_rows": self.host_rows,
            "gpu_cache_rows": self.gpu_cache_rows,
            "bytes": self.tier_bytes(),
            "outside_precision": dict(self.outside_precision),
        }


@dataclass(frozen=True)
class ModelFootprint:
    """Bytes each tier holds for one model.

    Attributes:
        model: the model's name.
        gpus: GPUs in ``deployed_device_list``.
        tables: per table.
    """

    model: str
    gpus: int
    tables: tuple[TableFootprint, ...]

    @property
    def host(self) -> int:
        """Shared host tiers of every table, per machine."""
        return sum(t.host for t in self.tables)

    @property
    def gpu(self) -> int:
        """GPU bytes of every table, per GPU instance."""
        return sum(t.gpu for t in self.tables)

    @property
    def precision(self) -> str:
        """The tables' storage precision when they share one, else ``"mixed"``.

        Example:
            >>> ModelFootprint("m", 1, ()).precision
            'fp32'
        """
        precisions = {t.precision for t in self.tables} or {"fp32"}
        return precisions.pop() if len(precisions) == 1 else MIXED

    def tier_bytes(self) -> dict[str, int]:
        """Sum over the tables of each tier that any table has."""
        totals: dict[str, int] = {}
        for table in self.tables:
            for name, n in table.tier_bytes().items():
                totals[name] = totals.get(name, 0) + n
        return totals

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields (exact byte counts)."""
        return {
            "model": self.model,
            "precision": self.precision,
            "gpus": self.gpus,
            "bytes": self.tier_bytes(),
            "tables": [t.to_dict() for t in self.tables],
        }


def table_footprint(
    config: PSConfig, model: ModelConfig, table: TableConfig, rows: int
) -> TableFootprint:
    """Bytes each tier holds for one table of ``rows`` rows.

    Args:
        config: the parsed ps.json (its database sections decide the lower tiers).
        model: the table's model.
        table: the table.
        rows: rows of its sparse files (:func:`~hps_core.formats.sparse.inspect_sparse_table`).

    Returns:
        The footprint, in the table's storage precision.

    Example:
        >>> # A 1000-row table of dim 128 with "storage_precision": "fp16", no lower tier.
        >>> fp = table_footprint(config, model, model.tables[0], 1000)  # doctest: +SKIP
        >>> fp.precision, fp.host  # doctest: +SKIP
        ('fp16', 265152)
    """
    plan = tier_plan(config)
    dim = table.dim
    precision = table.storage
    layout = host_layout(rows, dim, plan.host_fraction, precision)
    gpu_cache = gpu_cache_rows = gpu_static = 0
    static = model.static_tables
    if static:
        gpu_static = static_table_nbytes(rows, dim, precision)
    elif model.gpucache:
        num_sets = num_sets_for(cache_capacity_rows(model.gpucacheper, rows))
        gpu_cache = slot_bytes(num_sets, dim, precision).nbytes
        gpu_cache_rows = num_sets * WAYS
    ranking = model.network_file is not None
    # Rows each database holds, and in which precision (FP32 unless store_compressed).
    outside = {
        "redis_cluster": (
            None if plan.redis_fraction is None else held_rows(rows, plan.redis_fraction),
            precision if config.volatile_db.store_compressed else _FP32,
        ),
        "rocks_db": (
            rows if plan.rocks else None,
            precision if config.persistent_db.store_compressed else _FP32,
        ),
    }
    payload = {
        tier: None if n is None else payload_bytes(n, dim, stored)
        for tier, (n, stored) in outside.items()
    }
    return TableFootprint(
        index=table.index,
        name=table.name,
        rows=rows,
        dim=dim,
        precision=precision.value,
        host=layout.nbytes + (index_layout(rows, dim).nbytes if plan.model_files else 0),
        host_rows=layout.rows,
        gpu_cache=gpu_cache,
        gpu_cache_rows=gpu_cache_rows,
        gpu_static=gpu_static,
        gpu_index=layout.index_nbytes if ranking and not static else 0,
        redis_cluster=payload["redis_cluster"],
        rocks_db=payload["rocks_db"],
        outside_precision={
            tier: stored.value for tier, (n, stored) in outside.items() if n is not None
        },
    )


def model_footprint(
    config: PSConfig, model: ModelConfig, rows: Sequence[int] | None = None
) -> ModelFootprint:
    """Bytes each tier holds for every table of ``model``.

    Args:
        config: the parsed ps.json.
        model: one of its models.
        rows: rows of each table's sparse files; by default read from the files' sizes.

    Returns:
        The footprint.

    Raises:
        HPSError: ``rows`` is not given and a sparse folder is missing or malformed.
    """
    if rows is None:
        rows = [inspect_sparse_table(t.sparse_file, t.dim).rows for t in model.tables]
    tables = tuple(
        table_footprint(config, model, table, n)
        for table, n in zip(model.tables, rows, strict=True)
    )
    return ModelFootprint(model.name, len(model.deployed_device_list), tables)
