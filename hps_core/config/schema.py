"""Typed, frozen view of a HugeCTR ps.json.

Attribute names are HugeCTR's ps.json keys, so ``model.gpucacheper`` reads like the file.
Defaults are HugeCTR v24.06's parser defaults (see :mod:`hps_core.config.parse` for where they
differ from HugeCTR's documentation). ``to_dict`` writes the same keys back, so a config can
be saved as a ps.json that HugeCTR itself accepts.

Example:
    >>> from hps_core.config import load_ps_config
    >>> cfg = load_ps_config("model_repository/wdl/ps.json")  # doctest: +SKIP
    >>> for table in cfg.model("wdl").tables:  # doctest: +SKIP
    ...     print(table.name, table.dim, table.sparse_file)
"""

from __future__ import annotations

import difflib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hps_core.config.enums import (
    DatabaseType,
    EmbeddingCacheType,
    OverflowPolicy,
    UpdateSourceType,
)
from hps_core.errors import ConfigError, Problem
from hps_core.formats.uris import ModelPath
from hps_core.quant import RowFormat, StoragePrecision

DEFAULT_UPDATE_FILTERS = ("^hps_.+$",)


def default_table_name(index: int) -> str:
    """Name HugeCTR gives table ``index`` when ``embedding_table_names`` is absent (0-based)."""
    return f"sparse_embedding{index}"


def _path_text(path: ModelPath, relative_to: Path | None) -> str:
    if relative_to is not None and isinstance(path, Path):
        try:
            return path.relative_to(relative_to).as_posix()
        except ValueError:
            pass  # outside ``relative_to``: keep it absolute
    return str(path)


@dataclass(frozen=True)
class TableConfig:
    """One embedding table of a model, gathered from the model's per-table lists.

    Args:
        index: position of the table in the model's lists (HugeCTR's ``table_id``).
        name: ``embedding_table_names[index]``.
        sparse_file: ``sparse_files[index]``, the sparse model folder (``key``/``emb_vector``).
        dim: ``embedding_vecsize_per_table[index]``.
        default_value: ``default_value_for_each_table[index]``, returned for unknown keys.
        max_query_per_sample: ``maxnum_catfeature_query_per_table_per_sample[index]``.
        storage: how every tier in this process stores the table's rows (the shared host
            tier, the GPU caches and static tables, the update overlay); Redis and RocksDB
            keep HugeCTR's FP32 layout unless their ``store_compressed`` is set.
            :class:`ModelConfig` resolves it from the ps.json's
            ``storage_precision_per_table``, ``storage_precision`` and ``fp8_quant``.
    """

    index: int
    name: str
    sparse_file: Path
    dim: int
    default_value: float
    max_query_per_sample: int
    storage: StoragePrecision = StoragePrecision.FP32

    @property
    def row_format(self) -> RowFormat:
        """Layout and codec of one stored row of the table."""
        return RowFormat(self.storage, self.dim)


def row_is_smaller(precision: StoragePrecision, dim: int) -> bool:
    """Whether a row of ``dim`` values stored in ``precision`` takes fewer bytes than its FP32
    row (``4 * dim``). A compressed precision that is not smaller only adds rounding error:
    int8's scale and bias take 8 bytes, and every row is padded to 4 bytes.

    Args:
        precision: the storage precision (fp32 is never smaller than itself).
        dim: values per row, at least 1.

    Returns:
        True when :attr:`RowFormat.row_bytes` is below ``4 * dim``.

    Example:
        >>> row_is_smaller(StoragePrecision.INT8, 3), row_is_smaller(StoragePrecision.INT8, 4)
        (False, True)
    """
    return RowFormat(precision, dim).row_bytes < 4 * dim


def fp8_quant_storage(dim: int) -> StoragePrecision:
    """The storage ``fp8_quant: true`` gives a static table of width ``dim``: FP8, as in
    HugeCTR, except where an FP8 row (values padded to 4 bytes, and a 4-byte scale) would not
    be smaller than the FP32 row (``dim`` 1 and 2), which then stays FP32. HugeCTR quantises
    those too; refusing them instead would reject a HugeCTR file (a Wide&Deep model's wide
    table has ``dim`` 1) that cannot be fixed without dropping ``fp8_quant``.

    Args:
        dim: values per row, at least 1.

    Returns:
        ``StoragePrecision.FP8`` or ``StoragePrecision.FP32``.

    Example:
        >>> fp8_quant_storage(1).value, fp8_quant_storage(16).value
        ('fp32', 'fp8')
    """
    fp8 = StoragePrecision.FP8
    return fp8 if row_is_smaller(fp8, dim) else StoragePrecision.FP32


def storage_problems(
    dims: tuple[int, ...],
    storage_precision: StoragePrecision | None,
    storage_precision_per_table: tuple[StoragePrecision, ...] | None,
    fp8_quant: bool,
    static_tables: bool,
    table_names: tuple[str, ...],
) -> list[Problem]:
    """Problems of a model's storage fields, each at its ps.json key within the model entry
    (``storage_precision``, ``storage_precision_per_table[1]``).

    The precision that decides (the per-table list's entry when there is a list, else
    ``storage_precision``) is a problem where it contradicts ``fp8_quant: true`` on a static
    model (it names something other than fp8 for a table that ``fp8_quant`` stores in fp8,
    :func:`fp8_quant_storage`), or where a table's stored row would not be smaller than its
    FP32 row (:func:`row_is_smaller`). ``dims``, the per-table list and ``table_names`` must
    have one entry per table.

    Args:
        dims: ``embedding_vecsize_per_table``.
        storage_precision: the model-wide precision, if named.
        storage_precision_per_table: the per-table precisions, if named (they win over
            ``storage_precision``, which is then not checked).
        fp8_quant: HugeCTR's ``fp8_quant``.
        static_tables: whether the model's GPU instances hold static tables
            (:attr:`ModelConfig.static_tables`).
        table_names: ``embedding_table_names``.

    Returns:
        The problems, empty when the fields are consistent.

    Example:
        >>> [str(p) for p in storage_problems((1,), StoragePrecision.INT8, None, False, False,
        ...                                   ("wide",))]  # doctest: +ELLIPSIS
        ['storage_precision: int8 would store table "wide" (dim 1) in 12 bytes per row, ...']
    """
    named: list[tuple[str, StoragePrecision, tuple[int, ...]]]
    if storage_precision_per_table is not None:
        named = [
            (f"storage_precision_per_table[{i}]", precision, (i,))
            for i, precision in enumerate(storage_precision_per_table)
        ]
    elif storage_precision is not None:
        named = [("storage_precision", storage_precision, tuple(range(len(dims))))]
    else:
        return []
    problems: list[Problem] = []
    for key, precision, tables in named:
        field_name = key.partition("[")[0]
        quantised = [i for i in tables if fp8_quant_storage(dims[i]) is StoragePrecision.FP8]
        if fp8_quant and static_tables and precision is not StoragePrecision.FP8 and quantised:
            problems.append(
                Problem(
                    key,
                    f'"{precision.value}" contradicts "fp8_quant": true, which stores the tables '
                    f'of a static model in fp8 as HugeCTR does; remove "fp8_quant" to store '
                    f"{_tables_text(quantised, table_names)} in {precision.value}, or remove "
                    f'"{field_name}" to keep fp8',
                )
            )
            continue
        if precision is StoragePrecision.FP32:
            continue
        for i in tables:
            if not row_is_smaller(precision, dims[i]):
                problems.append(
                    Problem(
                        key,
                        f'{precision.value} would store table "{table_names[i]}" (dim '
                        f"{dims[i]}) in {RowFormat(precision, dims[i]).row_bytes} bytes per row, "
                        f"not fewer than its {4 * dims[i]} bytes in fp32 (rows are padded to 4 "
                        f"bytes{_scale_note(precision)}); {_fp32_hint(key)}",
                    )
                )
    return problems


def _fp32_hint(key: str) -> str:
    if key == "storage_precision":
        return 'keep it in fp32 with "storage_precision_per_table", one precision per table'
    return 'write "fp32" for it'


def _tables_text(tables: list[int], names: tuple[str, ...]) -> str:
    shown = ", ".join(f'"{names[i]}"' for i in tables)
    return f"table {shown}" if len(tables) == 1 else f"tables {shown}"


def _scale_note(precision: StoragePrecision) -> str:
    if precision is StoragePrecision.INT8:
        return ", and a 4-byte scale and a 4-byte bias follow the values"
    if precision is StoragePrecision.FP8:
        return ", and a 4-byte scale follows the values"
    return ""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """One entry of ``models`` in ps.json.

    The per-table lists keep HugeCTR's names; ``tables`` holds the same data one table per
    entry, which is what the rest of the engine should use. ``embedding_cache_type`` is the
    effective cache type: ``static`` whenever ``use_static_table`` is true, as in HugeCTR.
    ``ignored_keys`` lists keys HugeCTR accepts in ps.json but does not use (they are not
    written back by ``to_dict``).

    Storage precision of the tables (each ``TableConfig.storage``), first that applies:
    ``storage_precision_per_table`` (an extension of this project), ``storage_precision`` (an
    extension), fp8 when ``fp8_quant`` is true on a model with :attr:`static_tables` (as in
    HugeCTR; :func:`fp8_quant_storage` keeps ``dim`` 1 and 2 in fp32), else fp32. Both
    extension fields are ``None`` when not given, and ``to_dict`` then leaves them out.
    """

    model: str
    sparse_files: tuple[Path, ...]
    deployed_device_list: tuple[int, ...]
    default_value_for_each_table: tuple[float, ...]
    maxnum_catfeature_query_per_table_per_sample: tuple[int, ...]
    embedding_vecsize_per_table: tuple[int, ...]
    embedding_table_names: tuple[str, ...] = ()
    dense_file: Path | None = None
    network_file: Path | None = None
    non_trainable_params_file: Path | None = None
    max_batch_size: int = 64
    gpucache: bool = True
    gpucacheper: float = 0.2
    hit_rate_threshold: float = 0.9
    num_of_worker_buffer_in_pool: int = 1
    num_of_refresher_buffer_in_pool: int = 1
    cache_refresh_percentage_per_iteration: float = 0.0
    maxnum_des_feature_per_sample: int = 26
    refresh_delay: float = 0.0
    refresh_interval: int = 0
    # Not read by HugeCTR's ps.json parser (its backends take them from config.pbtxt) and
    # decided here by the network file; None when not given, checked against it when given.
    label_dim: int | None = None
    slot_num: int | None = None
    use_static_table: bool = False
    embedding_cache_type: EmbeddingCacheType = EmbeddingCacheType.DYNAMIC
    use_context_stream: bool = True
    use_hctr_cache_implementation: bool = True
    init_ec: bool = True
    enable_pagelock: bool = False
    fp8_quant: bool = False
    use_mixed_precision: bool = False
    thread_pool_size: int = 16
    storage_precision: StoragePrecision | None = None
    storage_precision_per_table: tuple[StoragePrecision, ...] | None = None
    ignored_keys: tuple[str, ...] = field(default=(), compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)
    """What reading the entry changed, as HugeCTR changes it (a warning each)."""
    tables: tuple[TableConfig, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.sparse_files)
        if not self.embedding_table_names:
            object.__setattr__(
                self, "embedding_table_names", tuple(default_table_name(i) for i in range(n))
            )
        if self.use_static_table:
            object.__setattr__(self, "embedding_cache_type", EmbeddingCacheType.STATIC)
        self._parse_storage_fields()
        per_table = {
            "embedding_table_names": self.embedding_table_names,
            "embedding_vecsize_per_table": self.embedding_vecsize_per_table,
            "default_value_for_each_table": self.default_value_for_each_table,
            "maxnum_catfeature_query_per_table_per_sample": (
                self.maxnum_catfeature_query_per_table_per_sample
            ),
        }
        if self.storage_precision_per_table is not None:
            per_table["storage_precision_per_table"] = self.storage_precision_per_table
        problems = [
            Problem(key, f"has {len(values)} entries but sparse_files lists {n} tables")
            for key, values in per_table.items()
            if len(values) != n
        ]
        if problems:
            raise ConfigError(problems)
        problems = storage_problems(
            self.embedding_vecsize_per_table,
            self.storage_precision,
            self.storage_precision_per_table,
            self.fp8_quant,
            self.static_tables,
            self.embedding_table_names,
        )
        if problems:
            raise ConfigError(problems)
        tables = tuple(
            TableConfig(
                index=i,
                name=self.embedding_table_names[i],
                sparse_file=self.sparse_files[i],
                dim=self.embedding_vecsize_per_table[i],
                default_value=self.default_value_for_each_table[i],
                max_query_per_sample=self.maxnum_catfeature_query_per_table_per_sample[i],
                storage=self._table_storage(i),
            )
            for i in range(n)
        )
        object.__setattr__(self, "tables", tables)

    def _parse_storage_fields(self) -> None:
        """Accept precision names (``"fp16"``) as well as members when built in code."""
        problems = []
        if self.storage_precision is not None:
            try:
                precision = StoragePrecision.parse(self.storage_precision)
                object.__setattr__(self, "storage_precision", precision)
            except ValueError as exc:
                problems.append(Problem("storage_precision", str(exc)))
        if self.storage_precision_per_table is not None:
            parsed = []
            for i, value in enumerate(self.storage_precision_per_table):
                try:
                    parsed.append(StoragePrecision.parse(value))
                except ValueError as exc:
                    problems.append(Problem(f"storage_precision_per_table[{i}]", str(exc)))
            object.__setattr__(self, "storage_precision_per_table", tuple(parsed))
        if problems:
            raise ConfigError(problems)

    def _table_storage(self, index: int) -> StoragePrecision:
        if self.storage_precision_per_table is not None:
            return self.storage_precision_per_table[index]
        if self.storage_precision is not None:
            return self.storage_precision
        if self.fp8_quant and self.static_tables:
            return fp8_quant_storage(self.embedding_vecsize_per_table[index])
        return StoragePrecision.FP32

    @property
    def static_tables(self) -> bool:
        """Whether the model's GPU instances hold static tables rather than dynamic caches:
        ``gpucache`` with ``embedding_cache_type`` ``"static"`` (or ``use_static_table``).
        Without ``gpucache`` there is no GPU table to be static, so ``fp8_quant`` has no
        effect then either."""
        return self.gpucache and self.embedding_cache_type == EmbeddingCacheType.STATIC

    @property
    def name(self) -> str:
        """The model name (ps.json key ``model``)."""
        return self.model

    def to_dict(self, relative_to: Path | None = None) -> dict[str, Any]:
        """Return this model as a ps.json ``models`` entry (HugeCTR key names).

        Args:
            relative_to: write paths under this folder relative to it (pass the folder the
                ps.json will be saved in); other paths are written absolute.

        Returns:
            A JSON-serialisable dict.
        """
        out: dict[str, Any] = {
            "model": self.model,
            "sparse_files": [_path_text(p, relative_to) for p in self.sparse_files],
        }
        for key in ("dense_file", "network_file", "non_trainable_params_file"):
            path = getattr(self, key)
            if path is not None:
                out[key] = _path_text(path, relative_to)
        out.update(
            {
                "deployed_device_list": list(self.deployed_device_list),
                "max_batch_size": self.max_batch_size,
                "default_value_for_each_table": list(self.default_value_for_each_table),
                "maxnum_des_feature_per_sample": self.maxnum_des_feature_per_sample,
                "maxnum_catfeature_query_per_table_per_sample": list(
                    self.maxnum_catfeature_query_per_table_per_sample
                ),
                "embedding_vecsize_per_table": list(self.embedding_vecsize_per_table),
                "embedding_table_names": list(self.embedding_table_names),
            }
        )
        for key in ("label_dim", "slot_num"):  # HugeCTR's samples write them; optional
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out.update(
            {
                "gpucache": self.gpucache,
                "gpucacheper": self.gpucacheper,
                "hit_rate_threshold": self.hit_rate_threshold,
                "num_of_worker_buffer_in_pool": self.num_of_worker_buffer_in_pool,
                "num_of_refresher_buffer_in_pool": self.num_of_refresher_buffer_in_pool,
                "cache_refresh_percentage_per_iteration": (
                    self.cache_refresh_percentage_per_iteration
                ),
                "refresh_delay": self.refresh_delay,
                "refresh_interval": self.refresh_interval,
                "use_static_table": self.use_static_table,
                "embedding_cache_type": self.embedding_cache_type.value,
                "use_context_stream": self.use_context_stream,
                "use_hctr_cache_implementation": self.use_hctr_cache_implementation,
                "init_ec": self.init_ec,
                "enable_pagelock": self.enable_pagelock,
                "fp8_quant": self.fp8_quant,
                "thread_pool_size": self.thread_pool_size,
            }
        )
        if self.use_mixed_precision:  # HugeCTR's hugectr backend reads it; its docs omit it
            out["use_mixed_precision"] = True
        # Extensions of this project, written only when given: HugeCTR's files stay unchanged.
        if self.storage_precision is not None:
            out["storage_precision"] = self.storage_precision.value
        if self.storage_precision_per_table is not None:
            out["storage_precision_per_table"] = [p.value for p in self.storage_precision_per_table]
        return out


@dataclass(frozen=True, kw_only=True)
class VolatileDBConfig:
    """``volatile_db``: the host-memory (or Redis) tier in front of the persistent one.

    ``num_partitions`` ``None`` means HugeCTR's default, ``min(16, CPU cores)`` on the serving
    machine (see ``resolved_num_partitions``); ``overflow_margin`` ``None`` means no limit.
    """

    type: DatabaseType = DatabaseType.PARALLEL_HASH_MAP
    address: str = "127.0.0.1:7000"
    user_name: str = "default"
    password: str = field(default="", repr=False)  # a secret: kept out of logs and messages
    num_partitions: int | None = None
    allocation_rate: int = 256 * 1024**2
    shared_memory_size: int = 16 * 1024**3
    shared_memory_name: str = "hctr_mp_hash_map_database"
    shared_memory_auto_remove: bool = True
    num_node_connections: int = 5
    max_batch_size: int = 64 * 1024
    enable_tls: bool = False
    tls_ca_certificate: Path = Path("cacertbundle.crt")
    tls_client_certificate: Path = Path("client_cert.pem")
    tls_client_key: Path = Path("client_key.pem")
    tls_server_name_identification: str = "redis.localhost"
    overflow_margin: int | None = None
    overflow_policy: OverflowPolicy = OverflowPolicy.EVICT_RANDOM
    overflow_resolution_target: float = 0.8
    initialize_after_startup: bool = True
    initial_cache_rate: float = 1.0
    cache_missed_embeddings: bool = False
    update_filters: tuple[str, ...] = DEFAULT_UPDATE_FILTERS
    store_compressed: bool = False
    ignored_keys: tuple[str, ...] = field(default=(), compare=False)

    @property
    def resolved_num_partitions(self) -> int:
        """``num_partitions``, or HugeCTR's default ``min(16, CPU cores)`` when not set."""
        if self.num_partitions is not None:
            return self.num_partitions
        return min(16, os.cpu_count() or 1)

    def to_dict(self, relative_to: Path | None = None) -> dict[str, Any]:
        """Return this section as ps.json ``volatile_db`` (HugeCTR key names).

        Args:
            relative_to: folder to write the TLS file paths relative to, when they lie in it.

        Returns:
            A JSON-serialisable dict.
        """
        out: dict[str, Any] = {
            "type": self.type.value,
            "address": self.address,
            "user_name": self.user_name,
            "password": self.password,
        }
        if self.num_partitions is not None:
            out["num_partitions"] = self.num_partitions
        out.update(
            {
                "allocation_rate": self.allocation_rate,
                "shared_memory_size": self.shared_memory_size,
                "shared_memory_name": self.shared_memory_name,
                "shared_memory_auto_remove": self.shared_memory_auto_remove,
                "num_node_connections": self.num_node_connections,
                "max_batch_size": self.max_batch_size,
                "enable_tls": self.enable_tls,
                "tls_ca_certificate": _path_text(self.tls_ca_certificate, relative_to),
                "tls_client_certificate": _path_text(self.tls_client_certificate, relative_to),
                "tls_client_key": _path_text(self.tls_client_key, relative_to),
                "tls_server_name_identification": self.tls_server_name_identification,
            }
        )
        if self.overflow_margin is not None:
            out["overflow_margin"] = self.overflow_margin
        out.update(
            {
                "overflow_policy": self.overflow_policy.value,
                "overflow_resolution_target": self.overflow_resolution_target,
                "initialize_after_startup": self.initialize_after_startup,
                "initial_cache_rate": self.initial_cache_rate,
                "cache_missed_embeddings": self.cache_missed_embeddings,
                "update_filters": list(self.update_filters),
            }
        )
        if self.store_compressed:  # an extension: written only when set
            out["store_compressed"] = True
        return out


@dataclass(frozen=True, kw_only=True)
class PersistentDBConfig:
    """``persistent_db``: the on-disk tier (RocksDB) that holds every embedding."""

    type: DatabaseType = DatabaseType.DISABLED
    path: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "rocksdb")
    num_threads: int = 16
    read_only: bool = False
    max_batch_size: int = 64 * 1024
    initialize_after_startup: bool = True
    update_filters: tuple[str, ...] = DEFAULT_UPDATE_FILTERS
    store_compressed: bool = False
    ignored_keys: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self, relative_to: Path | None = None) -> dict[str, Any]:
        """Return this section as ps.json ``persistent_db`` (HugeCTR key names).

        Args:
            relative_to: folder to write ``path`` relative to, when it lies in it.

        Returns:
            A JSON-serialisable dict.
        """
        out: dict[str, Any] = {
            "type": self.type.value,
            "path": _path_text(self.path, relative_to),
            "num_threads": self.num_threads,
            "read_only": self.read_only,
            "max_batch_size": self.max_batch_size,
            "initialize_after_startup": self.initialize_after_startup,
            "update_filters": list(self.update_filters),
        }
        if self.store_compressed:  # an extension: written only when set
            out["store_compressed"] = True
        return out


@dataclass(frozen=True, kw_only=True)
class UpdateSourceConfig:
    """``update_source``: the stream of online embedding updates (Kafka in HugeCTR).

    Defaults are HugeCTR v24.06's ``UpdateSourceParams``; :mod:`hps_core.updates` uses them.

    Args:
        type: ``null`` (no updates) or ``kafka_message_queue`` (aliases ``kafka_mq``,
            ``kafka``).
        brokers: ``host[:port]`` entries separated by ``;`` (HugeCTR's docs) or ``,``.
        metadata_refresh_interval_ms: how often topic metadata is fetched again, i.e. how
            late a consumer sees a new partition (>= 10).
        receive_buffer_size: largest message in bytes; should equal the training side's
            ``send_buffer_size`` (>= 1024).
        poll_timeout_ms: longest wait for a message before pending offsets are committed
            (>= 1).
        max_batch_size: most rows applied in one call (the producer packs messages to it).
        failure_backoff_ms: pause after a broker error or a failed apply.
        max_commit_interval: offsets are committed once more than this many messages were
            applied since the last commit (and whenever the stream goes idle).
    """

    type: UpdateSourceType = UpdateSourceType.NULL
    brokers: str = "127.0.0.1:9092"
    metadata_refresh_interval_ms: int = 30_000
    receive_buffer_size: int = 256 * 1024
    poll_timeout_ms: int = 500
    max_batch_size: int = 8 * 1024
    failure_backoff_ms: int = 50
    max_commit_interval: int = 32
    ignored_keys: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Return this section as ps.json ``update_source`` (HugeCTR key names).

        Returns:
            A JSON-serialisable dict.
        """
        return {
            "type": self.type.value,
            "brokers": self.brokers,
            "metadata_refresh_interval_ms": self.metadata_refresh_interval_ms,
            "receive_buffer_size": self.receive_buffer_size,
            "poll_timeout_ms": self.poll_timeout_ms,
            "max_batch_size": self.max_batch_size,
            "failure_backoff_ms": self.failure_backoff_ms,
            "max_commit_interval": self.max_commit_interval,
        }


@dataclass(frozen=True, kw_only=True)
class PSConfig:
    """A whole ps.json: the models and the storage tiers they share.

    Args:
        models: the ``models`` entries, in file order; names are unique.
        supportlonglong: keys are int64 (``true``) or int32 (``false``).
        fuse_embedding_table: HugeCTR's table fusion switch (tables of equal ``dim`` share
            storage); applies to every model.
        volatile_db: host-memory tier.
        persistent_db: on-disk tier.
        update_source: online update stream.
        source_path: the ps.json this came from (``None`` if built in code); relative paths
            in it were resolved against its folder.
        legacy_keys: keys of HugeCTR before v3.3 present in the file (read by nothing, as
            by HugeCTR since), with their values.
        repeated_keys: keys given more than once in one object with different values: their
            location (``models[0].gpucache``) and every value in file order; the last one
            is taken, as HugeCTR's JSON reader takes it.
    """

    models: tuple[ModelConfig, ...]
    supportlonglong: bool = True
    fuse_embedding_table: bool = False
    volatile_db: VolatileDBConfig = field(default_factory=VolatileDBConfig)
    persistent_db: PersistentDBConfig = field(default_factory=PersistentDBConfig)
    update_source: UpdateSourceConfig = field(default_factory=UpdateSourceConfig)
    source_path: Path | None = field(default=None, compare=False)
    legacy_keys: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    repeated_keys: tuple[tuple[str, tuple[Any, ...]], ...] = field(default=(), compare=False)

    @property
    def model_names(self) -> tuple[str, ...]:
        """Names of the models, in file order."""
        return tuple(m.model for m in self.models)

    def model(self, name: str) -> ModelConfig:
        """Return the model called ``name``.

        Args:
            name: the ``model`` value of a ``models`` entry (Triton's model name).

        Returns:
            The model's configuration.

        Raises:
            ConfigError: no model has that name; the message lists the known models.
        """
        for model in self.models:
            if model.model == name:
                return model
        raise ConfigError(_unknown_model(name, self.model_names, self.source_path))

    def to_dict(self, relative_to: Path | None = None) -> dict[str, Any]:
        """Return the whole config as a ps.json dict (HugeCTR key names).

        Args:
            relative_to: write file paths under this folder relative to it; pass the folder
                the ps.json will be written to so that the repository can be moved.

        Returns:
            A JSON-serialisable dict that :func:`parse_ps_config` reads back to an equal
            config (given the same folder).
        """
        return {
            "supportlonglong": self.supportlonglong,
            "fuse_embedding_table": self.fuse_embedding_table,
            "volatile_db": self.volatile_db.to_dict(relative_to),
            "persistent_db": self.persistent_db.to_dict(relative_to),
            "update_source": self.update_source.to_dict(),
            "models": [m.to_dict(relative_to) for m in self.models],
        }


def _unknown_model(name: str, known: tuple[str, ...], source: Path | None) -> Problem:
    message = f'no model named "{name}"'
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        message += f' (did you mean "{close[0]}"?)'
    message += "; known models: " + (", ".join(f'"{k}"' for k in known) or "none")
    if source is not None:
        message += f" (in {source})"
    return Problem("models", message)
