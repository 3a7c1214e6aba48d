"""HugeCTR's ``InferenceParams`` and the classes and enums it takes, as HugeCTR v24.06 spells
them, turned into the ps.json model they describe.

HugeCTR's ``hugectr.inference.InferenceParams(model_name, max_batchsize, hit_rate_threshold,
dense_model_file, sparse_model_files, device_id, use_gpu_embedding_cache,
cache_size_percentage, i64_input_key, use_mixed_precision, ...)`` (its pybind11 binding in
``HugeCTR/include/pybind/hps_wrapper.hpp``) holds what a ps.json model entry holds, under the
Python names: :class:`InferenceParams` has its 40 fields in its order with its defaults, and
:func:`ps_config_of` writes the ps.json it amounts to, with the network file of
``InferenceModel(model_config_path, inference_params)`` deciding what HugeCTR takes from it
(``parameter_server_config`` of a network file and ``InferenceParams`` in HugeCTR's
``src/hps/inference_utils.cpp``): each table's vector size and most keys per sample, the dense
features, ``label_dim`` and ``slot_num``.

Values are checked where they are given: a wrong type, an out-of-range number or an unknown
enum value is a :class:`~hps_core.errors.ConfigError` naming the field
(``InferenceParams.cache_size_percentage: expected a number in [0, 1], got 1.5``). Fields that
change nothing here are accepted and warned about, one line each, saying what HugeCTR does with
them (:mod:`hps_core.config.inert` for the ps.json fields they become; ``scaler``,
``use_algorithm_search`` and network-decided fields here).

Where this differs from HugeCTR, on purpose:
    - ``device_id`` on a machine without a GPU scores on the CPU, with a warning (HugeCTR
      fails), so a script written for a GPU runs anywhere; ``device_id=None`` asks for the CPU.
    - ``use_gpu_embedding_cache``, ``cache_size_percentage`` and ``i64_input_key`` have no
      default in HugeCTR either: leaving one out is an error naming it.
    - Relative paths are taken from the working directory, as HugeCTR takes them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from hps_core.config import PSConfig, parse_ps_config
from hps_core.config.enums import (
    DatabaseType,
    EmbeddingCacheType,
    OverflowPolicy,
    UpdateSourceType,
)
from hps_core.config.schema import UpdateSourceConfig
from hps_core.errors import ConfigError, Problem
from hps_core.formats.uris import is_uri
from hps_core.infer.inputs.layout import load_ranking_graph
from hps_core.nn import build_graph, load_network_json

log = logging.getLogger(__name__)

SOURCE = "InferenceParams"
"""What problems and warnings about :class:`InferenceParams` start with."""


class DatabaseType_t:
    """HugeCTR's ``hugectr.DatabaseType_t``: a database backend by HugeCTR's member names."""

    disabled = DatabaseType.DISABLED
    hash_map = DatabaseType.HASH_MAP
    parallel_hash_map = DatabaseType.PARALLEL_HASH_MAP
    multi_process_hash_map = DatabaseType.MULTI_PROCESS_HASH_MAP
    redis_cluster = DatabaseType.REDIS_CLUSTER
    rocks_db = DatabaseType.ROCKS_DB


class DatabaseOverflowPolicy_t:
    """HugeCTR's ``hugectr.DatabaseOverflowPolicy_t``."""

    evict_random = OverflowPolicy.EVICT_RANDOM
    evict_least_used = OverflowPolicy.EVICT_LEAST_USED
    evict_oldest = OverflowPolicy.EVICT_OLDEST


class UpdateSourceType_t:
    """HugeCTR's ``hugectr.UpdateSourceType_t``."""

    null = UpdateSourceType.NULL
    kafka_message_queue = UpdateSourceType.KAFKA_MESSAGE_QUEUE


class EmbeddingCacheType_t:
    """HugeCTR's ``hugectr.inference.EmbeddingCacheType_t``."""

    Dynamic = EmbeddingCacheType.DYNAMIC
    UVM = EmbeddingCacheType.UVM
    Static = EmbeddingCacheType.STATIC
    Stochastic = EmbeddingCacheType.STOCHASTIC


class DataReaderType_t(Enum):
    """HugeCTR's ``hugectr.DataReaderType_t``; offline scoring reads ``Parquet``."""

    Norm = "Norm"
    Raw = "Raw"
    Parquet = "Parquet"
    RawAsync = "RawAsync"


class Check_t(Enum):
    """HugeCTR's ``hugectr.Check_t``: a checksum of Norm files (Parquet has none)."""

    Sum = "Sum"
    Non = "Non"


@dataclass
class _DatabaseParams:
    """Fields written to the ps.json as they are named, when they differ from the default."""

    def ps_json(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            default = f.default if f.default is not MISSING else f.default_factory()
            if f.name in ("type", "backend") or value != default:
                out["type" if f.name == "backend" else f.name] = _plain(value)
        return out


@dataclass
class VolatileDatabaseParams(_DatabaseParams):
    """HugeCTR's ``hugectr.inference.VolatileDatabaseParams``: the ps.json's ``volatile_db``
    (its keys and defaults; see :class:`hps_core.config.VolatileDBConfig`)."""

    type: Any = DatabaseType.PARALLEL_HASH_MAP
    address: str = "127.0.0.1:7000"
    user_name: str = "default"
    password: str = ""
    num_partitions: int = min(16, os.cpu_count() or 1)
    allocation_rate: int = 256 * 1024 * 1024
    shared_memory_size: int = 16 * 1024**3
    shared_memory_name: str = "hctr_mp_hash_map_database"
    shared_memory_auto_remove: bool = True
    num_node_connections: int = 5
    max_batch_size: int = 64 * 1024
    enable_tls: bool = False
    tls_ca_certificate: str = "cacertbundle.crt"
    tls_client_certificate: str = "client_cert.pem"
    tls_client_key: str = "client_key.pem"
    tls_server_name_identification: str = "redis.localhost"
    overflow_margin: int = 2**64 - 1
    overflow_policy: Any = OverflowPolicy.EVICT_RANDOM
    overflow_resolution_target: float = 0.8
    initialize_after_startup: bool = True
    initial_cache_rate: float = 1.0
    cache_missed_embeddings: bool = False
    update_filters: list[str] = field(default_factory=lambda: ["^hps_.+$"])

    def ps_json(self) -> dict[str, Any]:
        out = super().ps_json()
        if out.get("overflow_margin") == 2**64 - 1:
            del out["overflow_margin"]
        return out


@dataclass
class PersistentDatabaseParams(_DatabaseParams):
    """HugeCTR's ``hugectr.inference.PersistentDatabaseParams``: the ps.json's
    ``persistent_db`` (``backend`` is its ``type``)."""

    backend: Any = DatabaseType.DISABLED
    path: str = "/tmp/rocksdb"
    num_threads: int = 16
    read_only: bool = False
    max_batch_size: int = 64 * 1024
    initialize_after_startup: bool = True
    update_filters: list[str] = field(default_factory=lambda: ["^hps_.+$"])


_UPDATE_SOURCE = UpdateSourceConfig()


@dataclass
class UpdateSourceParams(_DatabaseParams):
    """HugeCTR's ``hugectr.inference.UpdateSourceParams``: the ps.json's ``update_source``."""

    # The ps.json parser's defaults (UpdateSourceConfig), which are HugeCTR's.
    type: Any = _UPDATE_SOURCE.type
    brokers: str = _UPDATE_SOURCE.brokers
    metadata_refresh_interval_ms: int = _UPDATE_SOURCE.metadata_refresh_interval_ms
    receive_buffer_size: int = _UPDATE_SOURCE.receive_buffer_size
    poll_timeout_ms: int = _UPDATE_SOURCE.poll_timeout_ms
    max_batch_size: int = _UPDATE_SOURCE.max_batch_size
    failure_backoff_ms: int = _UPDATE_SOURCE.failure_backoff_ms
    max_commit_interval: int = _UPDATE_SOURCE.max_commit_interval


_REQUIRED: Any = object()  # a field HugeCTR's binding has no default for


@dataclass
class InferenceParams:
    """HugeCTR's ``hugectr.inference.InferenceParams``: its fields, order and defaults.

    The fields HugeCTR requires come first; ``use_gpu_embedding_cache``,
    ``cache_size_percentage`` and ``i64_input_key`` are required too (keyword arguments, as
    HugeCTR's samples pass them). ``ps.json`` equivalents: ``max_batchsize`` is
    ``max_batch_size``, ``dense_model_file`` ``dense_file``, ``sparse_model_files``
    ``sparse_files``, ``use_gpu_embedding_cache`` ``gpucache``, ``cache_size_percentage``
    ``gpucacheper``, ``i64_input_key`` ``supportlonglong``, ``deployed_devices``
    ``deployed_device_list``, ``number_of_worker_buffers_in_pool``
    ``num_of_worker_buffer_in_pool``, ``number_of_refresh_buffers_in_pool``
    ``num_of_refresher_buffer_in_pool``; the rest keep their names.

    Example:
        >>> params = InferenceParams(
        ...     model_name="wdl", max_batchsize=64, hit_rate_threshold=1.0,
        ...     dense_model_file="wdl_dense_0.model",
        ...     sparse_model_files=["wdl0_sparse_0.model", "wdl1_sparse_0.model"],
        ...     device_id=0, use_gpu_embedding_cache=True, cache_size_percentage=0.5,
        ...     i64_input_key=True)
        >>> params.max_batchsize
        64
    """

    model_name: str
    max_batchsize: int
    hit_rate_threshold: float
    dense_model_file: str
    sparse_model_files: Sequence[str]
    device_id: int | None = 0
    use_gpu_embedding_cache: bool = _REQUIRED
    cache_size_percentage: float = _REQUIRED
    i64_input_key: bool = _REQUIRED
    use_mixed_precision: bool = False
    scaler: float = 1.0
    use_algorithm_search: bool = True
    use_cuda_graph: bool = True
    number_of_worker_buffers_in_pool: int = 2
    number_of_refresh_buffers_in_pool: int = 1
    thread_pool_size: int = 16
    cache_refresh_percentage_per_iteration: float = 0.0
    deployed_devices: Sequence[int] = (0,)
    default_value_for_each_table: Sequence[float] = (0.0,)
    volatile_db: VolatileDatabaseParams = field(default_factory=VolatileDatabaseParams)
    persistent_db: PersistentDatabaseParams = field(default_factory=PersistentDatabaseParams)
    update_source: UpdateSourceParams = field(default_factory=UpdateSourceParams)
    maxnum_des_feature_per_sample: int = 26
    refresh_delay: float = 0.0
    refresh_interval: float = 0.0
    maxnum_catfeature_query_per_table_per_sample: Sequence[int] = (26,)
    embedding_vecsize_per_table: Sequence[int] = (128,)
    embedding_table_names: Sequence[str] = ("",)
    network_file: str = ""
    label_dim: int = 1
    slot_num: int = 10
    non_trainable_params_file: str = ""
    use_static_table: bool = False
    embedding_cache_type: Any = EmbeddingCacheType.DYNAMIC
    use_context_stream: bool = True
    fuse_embedding_table: bool = False
    use_hctr_cache_implementation: bool = True
    init_ec: bool = True
    enable_pagelock: bool = False
    fp8_quant: bool = False

    def __post_init__(self) -> None:
        problems = [
            Problem(f"{SOURCE}.{f.name}", "is required (HugeCTR's InferenceParams has no default)")
            for f in fields(self)
            if getattr(self, f.name) is _REQUIRED
        ]
        for name, check in _CHECKS.items():
            value = getattr(self, name)
            if value is _REQUIRED:
                continue
            message = check(value)
            if message:
                problems.append(Problem(f"{SOURCE}.{name}", f"{message}, got {value!r}"))
        for name, kind in (
            ("volatile_db", VolatileDatabaseParams),
            ("persistent_db", PersistentDatabaseParams),
            ("update_source", UpdateSourceParams),
        ):
            if not isinstance(getattr(self, name), kind):
                problems.append(
                    Problem(
                        f"{SOURCE}.{name}",
                        f"expected a {kind.__name__}, got {type(getattr(self, name)).__name__}",
                    )
                )
        if problems:
            raise ConfigError(problems)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_at_least(low: int) -> Any:
    return lambda v: None if _is_int(v) and v >= low else f"expected an integer >= {low}"


def _number_in(low: float, high: float | None = None) -> Any:
    span = f"in [{low:g}, {high:g}]" if high is not None else f">= {low:g}"

    def check(v: Any) -> str | None:
        ok = _is_number(v) and v >= low and (high is None or v <= high)
        return None if ok else f"expected a number {span}"

    return check


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "expected True or False"


def _text(v: Any) -> str | None:
    return None if isinstance(v, str | os.PathLike) else "expected a string"


def _list_of(check: Any, nonempty: bool = False) -> Any:
    def checked(v: Any) -> str | None:
        if isinstance(v, str | bytes) or not isinstance(v, Sequence):
            return "expected a list"
        if nonempty and not v:
            return "expected at least one entry"
        bad = [i for i, item in enumerate(v) if check(item)]
        return f"entry {bad[0]}: {check(v[bad[0]])}" if bad else None

    return checked


def _device(v: Any) -> str | None:
    ok = v is None or (_is_int(v) and v >= 0)
    return None if ok else "expected a GPU id >= 0 (or None for the CPU)"


def _cache_type(v: Any) -> str | None:
    names = ", ".join(f"EmbeddingCacheType_t.{m.name.title()}" for m in EmbeddingCacheType)
    return None if _enum_value(v, EmbeddingCacheType) is not None else f"expected one of {names}"


def _enum_value(value: Any, kind: type[Enum]) -> Enum | None:
    if isinstance(value, kind):
        return value
    name = getattr(value, "name", value)  # another binding's member, or a string
    if isinstance(name, str):
        for member in kind:
            if name.lower() in (member.value, member.name.lower()):
                return member
    return None


_CHECKS: dict[str, Any] = {
    "model_name": lambda v: None if isinstance(v, str) and v else "expected a non-empty name",
    "max_batchsize": _int_at_least(1),
    "hit_rate_threshold": _number_in(0),
    "dense_model_file": _text,
    "sparse_model_files": _list_of(_text, nonempty=True),
    "device_id": _device,
    "use_gpu_embedding_cache": _boolean,
    "cache_size_percentage": _number_in(0, 1),
    "i64_input_key": _boolean,
    "use_mixed_precision": _boolean,
    "scaler": _number_in(0),
    "use_algorithm_search": _boolean,
    "use_cuda_graph": _boolean,
    "number_of_worker_buffers_in_pool": _int_at_least(1),
    "number_of_refresh_buffers_in_pool": _int_at_least(0),
    "thread_pool_size": _int_at_least(1),
    "cache_refresh_percentage_per_iteration": _number_in(0, 1),
    "deployed_devices": _list_of(_int_at_least(0), nonempty=True),
    "default_value_for_each_table": _list_of(_number_in(float("-inf"))),
    "maxnum_des_feature_per_sample": _int_at_least(0),
    "refresh_delay": _number_in(0),
    "refresh_interval": _number_in(0),
    "maxnum_catfeature_query_per_table_per_sample": _list_of(_int_at_least(1)),
    "embedding_vecsize_per_table": _list_of(_int_at_least(1)),
    "embedding_table_names": _list_of(lambda v: None if isinstance(v, str) else "a string"),
    "network_file": _text,
    "label_dim": _int_at_least(1),
    "slot_num": _int_at_least(1),
    "non_trainable_params_file": _text,
    "use_static_table": _boolean,
    "embedding_cache_type": _cache_type,
    "use_context_stream": _boolean,
    "fuse_embedding_table": _boolean,
    "use_hctr_cache_implementation": _boolean,
    "init_ec": _boolean,
    "enable_pagelock": _boolean,
    "fp8_quant": _boolean,
}

# InferenceParams field -> ps.json model key, for the fields written as given.
_MODEL_KEYS = {
    "max_batchsize": "max_batch_size",
    "hit_rate_threshold": "hit_rate_threshold",
    "use_gpu_embedding_cache": "gpucache",
    "cache_size_percentage": "gpucacheper",
    "use_mixed_precision": "use_mixed_precision",
    "cache_refresh_percentage_per_iteration": "cache_refresh_percentage_per_iteration",
    "deployed_devices": "deployed_device_list",
    "refresh_delay": "refresh_delay",
    "use_static_table": "use_static_table",
    "init_ec": "init_ec",
}
# Fields whose ps.json key warns (hps_core.config.inert) when set: written only when the caller
# set them to something other than HugeCTR's Python default, so a default draws no warning.
_INERT_MODEL_KEYS = {
    "number_of_worker_buffers_in_pool": "num_of_worker_buffer_in_pool",
    "number_of_refresh_buffers_in_pool": "num_of_refresher_buffer_in_pool",
    "thread_pool_size": "thread_pool_size",
    "use_context_stream": "use_context_stream",
    "use_hctr_cache_implementation": "use_hctr_cache_implementation",
    "enable_pagelock": "enable_pagelock",
    "fp8_quant": "fp8_quant",
}
# Fields with no ps.json key that change nothing here: what HugeCTR does with them.
_INERT_HERE = {
    "scaler": "scales the loss of HugeCTR's FP16 training; inference never reads it",
    "use_algorithm_search": (
        "makes HugeCTR search cuBLAS algorithms for its FP16 GEMMs; here cuBLAS's heuristic chooses"
    ),
}
# Fields the network file decides (HugeCTR's parameter_server_config takes them from it).
_FROM_NETWORK = (
    "maxnum_des_feature_per_sample",
    "maxnum_catfeature_query_per_table_per_sample",
    "embedding_vecsize_per_table",
    "label_dim",
    "slot_num",
)
# ps.json location -> InferenceParams field, for problems the ps.json parser finds.
_FIELD_OF = {
    "model": "model_name",
    "sparse_files": "sparse_model_files",
    "dense_file": "dense_model_file",
    "non_trainable_params_file": "non_trainable_params_file",
    "embedding_table_names": "embedding_table_names",
    "default_value_for_each_table": "default_value_for_each_table",
    "refresh_interval": "refresh_interval",
    "embedding_cache_type": "embedding_cache_type",
    **{key: name for name, key in {**_MODEL_KEYS, **_INERT_MODEL_KEYS}.items()},
}


def _plain(value: Any) -> Any:
    """A value as JSON writes it (enum members by their ps.json spelling)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value


def _default(name: str) -> Any:
    f = next(f for f in fields(InferenceParams) if f.name == name)
    return f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]


def _differs(params: InferenceParams, name: str) -> bool:
    return _plain(getattr(params, name)) != _plain(_default(name))


def _located(path: str | os.PathLike[str]) -> str:
    """A local path made absolute (from the working directory, as HugeCTR opens it); a URI
    (``s3://``, ``hdfs://``, ...) as it is."""
    return os.fspath(path) if is_uri(path) else str(Path(path).resolve())


def network_model_entry(
    network_file: str | os.PathLike[str],
    model_name: str,
    dense_file: str | os.PathLike[str],
    sparse_files: Sequence[str | os.PathLike[str]],
) -> dict[str, Any]:
    """A ps.json model entry for HugeCTR's files: the tables' sizes, most keys per sample and
    the dense features as the network file has them (as HugeCTR reads them from it).

    Raises:
        ConfigError: the network has another number of embedding layers than
            ``sparse_files`` has entries, or is invalid.
    """
    graph = build_graph(load_network_json(network_file))
    embeddings = [node.layer for node in graph.embeddings]
    if len(sparse_files) != len(embeddings):
        raise ConfigError(
            f"{network_file} has {len(embeddings)} embedding layers, "
            f"{len(sparse_files)} sparse files were given",
            where="sparse_files",
        )
    nnz = {s.name: s.nnz_per_slot for s in graph.spec.data.sparse}
    return {
        "model": model_name,
        "network_file": _located(network_file),
        "dense_file": _located(dense_file),
        "sparse_files": [_located(p) for p in sparse_files],
        "embedding_vecsize_per_table": [e.vec_size for e in embeddings],
        "maxnum_catfeature_query_per_table_per_sample": [
            e.slot_num * nnz[e.sparse_input] for e in embeddings
        ],
        "maxnum_des_feature_per_sample": graph.spec.data.dense_dim,
        "default_value_for_each_table": [0.0] * len(embeddings),
        "deployed_device_list": [0],
    }


def ps_config_of(
    model_config_path: str | os.PathLike[str], params: InferenceParams
) -> tuple[PSConfig, list[str]]:
    """The ps.json configuration ``InferenceModel(model_config_path, params)`` serves, and a
    warning per field that changes nothing here.

    Args:
        model_config_path: the network JSON (HugeCTR's ``Model.graph_to_json`` output).
        params: the inference parameters.

    Returns:
        The configuration (read from no file) and the warnings.

    Raises:
        ConfigError: a field's value is refused (the problem names the ``InferenceParams``
            field), or the network does not fit the sparse files.
    """
    try:
        entry = network_model_entry(
            model_config_path,
            params.model_name,
            params.dense_model_file,
            params.sparse_model_files,
        )
    except ConfigError as exc:
        raise ConfigError(
            [Problem(f"{SOURCE}.sparse_model_files", p.message) for p in exc.problems]
            if exc.problems[0].where == "sparse_files"
            else exc.problems
        ) from None
    warnings: list[str] = []
    if params.network_file and _located(params.network_file) != _located(model_config_path):
        warnings.append(
            f"{SOURCE}.network_file = {params.network_file}: InferenceModel reads "
            f"model_config_path ({model_config_path}), as HugeCTR does"
        )
    for name, meaning in _INERT_HERE.items():
        if _differs(params, name):
            warnings.append(
                f"{SOURCE}.{name} = {_plain(getattr(params, name))}: accepted without effect: "
                f"{meaning}"
            )
    for name, key in _MODEL_KEYS.items():
        entry[key] = _plain(getattr(params, name))
    for name, key in _INERT_MODEL_KEYS.items():
        if _differs(params, name):
            entry[key] = _plain(getattr(params, name))
    if _differs(params, "default_value_for_each_table"):
        entry["default_value_for_each_table"] = _plain(params.default_value_for_each_table)
    if _differs(params, "embedding_table_names"):
        entry["embedding_table_names"] = _plain(params.embedding_table_names)
    if params.non_trainable_params_file:
        entry["non_trainable_params_file"] = _located(params.non_trainable_params_file)
    interval = params.refresh_interval
    entry["refresh_interval"] = int(interval) if float(interval).is_integer() else interval
    entry["embedding_cache_type"] = _enum_value(params.embedding_cache_type, EmbeddingCacheType)
    entry["embedding_cache_type"] = entry["embedding_cache_type"].value  # type: ignore[union-attr]
    if params.use_static_table:
        del entry["embedding_cache_type"]
    document: dict[str, Any] = {
        "supportlonglong": params.i64_input_key,
        "volatile_db": params.volatile_db.ps_json(),
        "persistent_db": params.persistent_db.ps_json(),
        "update_source": params.update_source.ps_json(),
        "models": [entry],
    }
    if params.fuse_embedding_table:
        document["fuse_embedding_table"] = True
    try:
        config = parse_ps_config(document, os.getcwd(), source=SOURCE)
        _, layout = load_ranking_graph(config.models[0])
    except ConfigError as exc:
        raise ConfigError([_as_field(p) for p in exc.problems]) from None
    from_network = {
        **{name: entry[name] for name in _FROM_NETWORK[:3]},
        "label_dim": layout.label_dim,
        "slot_num": layout.total_slots,
    }
    for name in _FROM_NETWORK:
        given, derived = _plain(getattr(params, name)), from_network[name]
        if _differs(params, name) and given != derived:
            warnings.append(
                f"{SOURCE}.{name} = {given}: the network file decides it, as in HugeCTR: "
                f"{derived} ({model_config_path})"
            )
    from hps_core.config.inert import inert_settings

    warnings += [_inert_line(line) for line in inert_settings(config)]
    return config, warnings


def _as_field(problem: Problem) -> Problem:
    """A ps.json parser's problem named by the ``InferenceParams`` field it came from."""
    where = problem.where
    if where.startswith("models[0]."):
        key, _, rest = where.removeprefix("models[0].").partition("[")
        name = _FIELD_OF.get(key, key)
        return Problem(f"{SOURCE}.{name}" + (f"[{rest}" if rest else ""), problem.message)
    if where.startswith(("volatile_db", "persistent_db", "update_source")):
        return Problem(
            f"{SOURCE}.{where.replace('persistent_db.type', 'persistent_db.backend')}",
            problem.message,
        )
    if where == "supportlonglong":
        return Problem(f"{SOURCE}.i64_input_key", problem.message)
    return Problem(f"{SOURCE}: {where}" if where else SOURCE, problem.message)


def _inert_line(line: str) -> str:
    """An :func:`~hps_core.config.inert.inert_settings` line named by the field it came from."""
    if line.startswith("models[0]."):
        key, _, rest = line.removeprefix("models[0].").partition(" ")
        model_part = rest.split(" (model ", 1)
        rest = rest if len(model_part) == 1 else model_part[0] + model_part[1].split(")", 1)[1]
        return f"{SOURCE}.{_FIELD_OF.get(key, key)} {rest}"
    return f"{SOURCE}.{line}"


def warn_inert(lines: Sequence[str]) -> None:
    """Log each warning line (the logging module prints warnings on stderr by default)."""
    for line in lines:
        log.warning("%s", line)
