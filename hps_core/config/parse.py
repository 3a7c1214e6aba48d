"""Read a HugeCTR ps.json into a :class:`~hps_core.config.schema.PSConfig`.

The keys, aliases and defaults are those of HugeCTR v24.06's ``parameter_server_config``
(``HugeCTR/src/hps/inference_utils.cpp``), so a ps.json written for HugeCTR's ``hps`` or
``hugectr`` Triton backend loads unchanged. Unlike HugeCTR, every problem in the file is
collected and reported at once in one :class:`~hps_core.errors.ConfigError`, each with its
location (``models[0].embedding_vecsize_per_table[1]``, ``volatile_db.type``) and what was
expected and found.

Paths:
    HugeCTR opens relative paths against the process working directory, which under Triton
    is wherever the server happened to be started. Here a relative path (``sparse_files``,
    ``dense_file``, ``network_file``, ``non_trainable_params_file``, ``persistent_db.path``,
    the TLS files of ``volatile_db``) is resolved against the folder holding the ps.json, so
    a model repository can be moved as a whole. Absolute paths are kept as they are. Whether
    the files exist is not checked here (the model-file readers do that).

Strictness (where this parser rejects files HugeCTR would accept):
    - Unknown keys are problems, with a "did you mean" suggestion; HugeCTR ignores them, so a
      typo such as ``gpucacheperr`` silently falls back to the default there. Keys HugeCTR
      accepts without using them (hugectr-backend ``config.pbtxt`` parameters such as
      ``cat_feature_num``, Python-API-only flags such as ``use_cuda_graph``, and keys older
      HugeCTR releases read such as ``max_get_batch_size``) are accepted and listed in
      ``ignored_keys``. Python ``InferenceParams`` names used as ps.json keys
      (``sparse_model_files``, ``deployed_devices``, ...) are problems naming the ps.json key.
    - Unknown enum values (``"type": "redis_clstr"``) are problems; HugeCTR silently falls
      back to the default backend.
    - Integers given as non-integral floats (``"max_batch_size": 64.5``) are problems; HugeCTR
      truncates them. Integral floats such as ``1e6`` are accepted, as in HugeCTR.
    - Ranges are checked (``gpucacheper`` in [0, 1], sizes >= 1, ...); HugeCTR wraps negative
      sizes around to huge unsigned values.
    - Per-table lists must have one entry per ``sparse_files`` entry, but for
      ``default_value_for_each_table``, which is fitted as HugeCTR fits it (a short list padded
      with ``0.0``, extra entries dropped) with a warning (``ModelConfig.notes``).
    - Quoted numbers and booleans, and names in any case with spaces or dashes, are read as
      HugeCTR's Triton backends read them; keys of HugeCTR before v3.3 (``db_type``, ...) are
      warned about (``PSConfig.legacy_keys``).
    - JSON comments and trailing commas are rejected, as HugeCTR's JSON reader does.
    - ``model`` must be a non-empty, unique name (HugeCTR defaults it to ``""``), and at least
      one sparse file is needed.
    - ``use_static_table: true`` together with an ``embedding_cache_type`` other than
      ``"static"`` is a problem (HugeCTR silently uses ``"static"``).
    - File paths may be URIs (``s3://``, ``hdfs://``, ``gs://``, HugeCTR's S3 HTTPS form; see
      :mod:`hps_core.formats.uris`): read through ``pyarrow.fs``, connected on first use; any
      other URL is a problem.

Accepted as HugeCTR accepts it, with a warning (:mod:`hps_core.config.inert` words them):
    - A key written twice in one object with different values: the last one is taken, as
      HugeCTR's JSON reader takes it (``PSConfig.repeated_keys``). HugeCTR's own
      hps-triton-ensemble sample gives ``num_of_refresher_buffer_in_pool`` 1 then 0.
    - Any count of 0 or more for the fields that have no effect here
      (``num_of_worker_buffer_in_pool``, ``num_of_refresher_buffer_in_pool``,
      ``thread_pool_size``), 0 included, which HugeCTR's parser takes too.

Differences from the docs (HugeCTR's parser is followed; the docs are
``docs/source/hierarchical_parameter_server/hps_database_backend.md``):
    - ``supportlonglong`` is required (the parser reads it with ``get_value_from_json``, which
      throws when it is missing); the docs give it a default of ``true``.
    - ``deployed_device_list``, ``default_value_for_each_table``,
      ``maxnum_catfeature_query_per_table_per_sample``, ``embedding_vecsize_per_table`` and
      ``sparse_files`` are required (``get_json``); the docs give defaults for the first two.
    - ``num_of_worker_buffer_in_pool`` defaults to 1; the docs say 2.
    - ``refresh_interval`` is an integer number of seconds (the parser reads it as ``int``);
      the docs say float.
    - Default table names are ``sparse_embedding0``, ``sparse_embedding1``, ... (0-based);
      the docs say ``sparse_embedding1``, ...
    - ``volatile_db`` present without ``type`` means ``disabled``; an absent ``volatile_db``
      means ``parallel_hash_map``. The docs give ``parallel_hash_map`` for both.
    - ``update_source.type`` defaults to ``null`` (no updates).
    - ``hit_rate_threshold`` may exceed 1 (HugeCTR then inserts every miss synchronously); the
      docs say "between 0 and 1" but also recommend values above 1 to avoid buffer-pool
      exhaustion. Negative values are rejected.
    - ``initialize_after_startup`` (``volatile_db``, ``persistent_db``) is documented and is
      a field of HugeCTR's parameter structs, but the JSON parser never reads it, so HugeCTR
      always initialises; it is read here with the same default, ``true``.
    - ``network_file``, ``label_dim``, ``slot_num`` and ``non_trainable_params_file`` appear
      in the docs' sample ps.json but the JSON parser does not read them (the hugectr backend
      took them from config.pbtxt). Here ``network_file`` is the model's network and
      ``non_trainable_params_file`` its BatchNorm statistics (default: the dense file's
      ``.ntp.json``); ``label_dim`` and ``slot_num`` stay None when absent, and where given
      the network decides them and ``hps check`` warns when they disagree with it.
    - ``use_hctr_cache_implementation``, ``init_ec``, ``enable_pagelock``, ``fp8_quant``,
      ``thread_pool_size`` and the ``stochastic`` cache type are v24.06 ``InferenceParams``
      fields; they are read with the defaults of HugeCTR's Python binding. ``init_ec``
      switches the initial cache fill as in HugeCTR; ``fp8_quant`` stores the tables of a
      model with static GPU tables in fp8 as in HugeCTR (tables of ``dim`` 1 and 2, whose
      FP8 row would not be smaller, stay FP32); the others that change nothing here, and
      ``fp8_quant`` without static tables, are listed with what HugeCTR does with them by
      :mod:`hps_core.config.inert`.
    - ``fuse_embedding_table`` is a top-level key applying to every model, as in the parser.

Extensions (keys HugeCTR does not have; its parser ignores them, so a file using them serves
FP32 tables there; ``to_dict`` writes them only when given):
    - ``storage_precision`` (model entry): ``"fp32"``, ``"fp16"``, ``"int8"`` or ``"fp8"``,
      how every tier in this process stores the model's tables
      (:class:`~hps_core.quant.rows.RowFormat`); Redis and RocksDB keep HugeCTR's FP32 layout
      unless ``store_compressed`` says otherwise.
    - ``storage_precision_per_table`` (model entry): one of those per table; it wins over
      ``storage_precision``.
    - ``store_compressed`` (``volatile_db`` of type ``redis_cluster``, ``persistent_db`` of
      type ``rocks_db``): ``true`` stores each compressed table there in its storage precision
      too, as the host tier holds it, under the name ``hps_et.<model>.<table>@<precision>``
      (:mod:`hps_core.tiers.encoded_rows`), which HugeCTR does not read; fp32 tables stay
      HugeCTR's. Default ``false``: HugeCTR's FP32 layout, rows encoded as they come up.
    Problems: ``store_compressed`` on another database type, or different in the two
    databases with ``cache_missed_embeddings``; an unknown precision; a per-table list of the
    wrong length; with ``fp8_quant: true`` on a static model, a precision other than fp8 for
    a table ``fp8_quant`` stores in fp8 (a contradiction: remove one of the two); a precision
    whose row would not be smaller than the table's FP32 row (int8 below ``dim`` 4, fp8 below
    3, fp16 at 1).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

from hps_core.config.checks import (
    AT_LEAST_0,
    UNIT,
    Collector,
    ObjectReader,
    dataclass_defaults,
    json_object_from_pairs,
)
from hps_core.config.enums import EMBEDDING_CACHE_TYPE_NAMES, DatabaseType, EmbeddingCacheType
from hps_core.config.parse_tiers import (
    persistent_db,
    update_source,
    volatile_db,
    volatile_defaults,
)
from hps_core.config.schema import (
    ModelConfig,
    PSConfig,
    VolatileDBConfig,
    default_table_name,
    storage_problems,
)
from hps_core.errors import ConfigError, Problem
from hps_core.formats.json_text import json_syntax_hint
from hps_core.quant import StoragePrecision

# Spellings of the storage precision extension fields: the values themselves, exactly.
_STORAGE_PRECISION_NAMES = {member.value: member for member in StoragePrecision}

# Keys HugeCTR accepts in a models entry without using them: parameters of the hugectr
# backend's config.pbtxt and InferenceParams flags the JSON parser never reads.
_MODEL_IGNORED = (
    "cat_feature_num",
    "des_feature_num",
    "max_nnz",
    "embedding_vector_size",
    "embeddingkey_long_type",
    "slots",
    "config",
    "mixed_precision",
    "scaler",
    "use_algorithm_search",
    "use_cuda_graph",
)
# Top-level keys of HugeCTR before v3.3, whose volatile_db and persistent_db replaced them;
# its parser has ignored them since, and its samples still carry some ("db_type": "local").
_TOP_LEGACY = ("db_type", "redis_ip", "rocksdb_path", "cache_size_percentage_redis")
_TOP_LEVEL_KEYS = (
    "supportlonglong",
    "fuse_embedding_table",
    "volatile_db",
    "persistent_db",
    "update_source",
    "models",
)

# Names from HugeCTR's Python InferenceParams that people write into ps.json by mistake.
_PYTHON_API_NAMES = {
    "model_name": "model",
    "max_batchsize": "max_batch_size",
    "dense_model_file": "dense_file",
    "sparse_model_files": "sparse_files",
    "use_gpu_embedding_cache": "gpucache",
    "cache_size_percentage": "gpucacheper",
    "number_of_worker_buffers_in_pool": "num_of_worker_buffer_in_pool",
    "number_of_refresh_buffers_in_pool": "num_of_refresher_buffer_in_pool",
    "deployed_devices": "deployed_device_list",
    "device_id": "deployed_device_list",
}

_MODEL_HINTS = {
    **{
        key: f'"{key}" is the name in HugeCTR\'s Python InferenceParams; in ps.json write '
        f'"{name}" (HugeCTR ignores "{key}" here)'
        for key, name in _PYTHON_API_NAMES.items()
    },
    "i64_input_key": 'write "supportlonglong" at the top level of ps.json instead',
    **{
        key: f'"{key}" belongs at the top level of ps.json, not inside a model'
        for key in _TOP_LEVEL_KEYS
    },
}

_MISSING_HINTS = {
    "supportlonglong": "HugeCTR v24.06 requires it: true for int64 keys, false for int32 keys",
    "models": "list the models this parameter server serves",
    "model": "give the model's name, as in Triton's model repository",
    "sparse_files": "list one sparse model folder per embedding table",
    "deployed_device_list": "list the GPU ids the model runs on, e.g. [0]",
    "default_value_for_each_table": "give one default embedding value per table, e.g. [0.0]",
    "maxnum_catfeature_query_per_table_per_sample": "give the most keys one sample looks up "
    "in each table",
    "embedding_vecsize_per_table": "give the embedding vector size of each table",
}


def load_ps_config(path: str | os.PathLike[str]) -> PSConfig:
    """Read and validate a ps.json file.

    Args:
        path: the ps.json file. Relative paths inside it are resolved against its folder.

    Returns:
        The validated configuration.

    Raises:
        ConfigError: the file cannot be read, is not valid JSON (the problem gives
            ``file:line:column``), or has problems (all of them are listed).

    Example:
        >>> cfg = load_ps_config("model_repository/wdl/ps.json")  # doctest: +SKIP
        >>> cfg.model("wdl").tables[0].dim  # doctest: +SKIP
        1
    """
    file = Path(os.path.abspath(path))
    try:
        # utf-8-sig: a byte-order mark is skipped, as HugeCTR's JSON reader skips it.
        text = file.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError([Problem(str(file), "cannot read ps.json: no such file")]) from None
    except IsADirectoryError:
        raise ConfigError(
            [Problem(str(file), "is a folder; give the path of the ps.json file in it")]
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [Problem(str(file), f"is not UTF-8 text (bad byte at offset {exc.start})")]
        ) from None
    except OSError as exc:
        raise ConfigError([Problem(str(file), f"cannot read ps.json: {exc.strerror}")]) from None
    try:
        obj = json.loads(text, object_pairs_hook=json_object_from_pairs)
    except json.JSONDecodeError as exc:
        message = f"malformed JSON: {exc.msg}{json_syntax_hint(text, exc.pos)}"
        raise ConfigError([Problem(f"{file}:{exc.lineno}:{exc.colno}", message)]) from None
    return parse_ps_config(obj, file.parent, source=file.name)


def parse_ps_config(
    obj: Mapping[str, Any], base_dir: str | os.PathLike[str], source: str = "ps.json"
) -> PSConfig:
    """Validate an already-decoded ps.json.

    Args:
        obj: the decoded JSON document.
        base_dir: folder that relative paths are resolved against (the ps.json's folder).
        source: the ps.json's file name inside ``base_dir`` (recorded as ``source_path``).

    Returns:
        The validated configuration.

    Raises:
        ConfigError: with every problem found.
    """
    base = Path(os.path.abspath(base_dir))
    collector = Collector(base)
    config = _root(collector, obj, source, base / source)
    if config is None or collector.problems:
        raise ConfigError(collector.problems)
    return config


def _root(c: Collector, obj: Any, source: str, source_path: Path) -> PSConfig | None:
    root = c.object(obj, source)
    if root is None:
        return None
    r = ObjectReader(c, root, "")
    defaults = dataclass_defaults(PSConfig)
    del defaults["supportlonglong"]  # required by HugeCTR's parser despite the documented default
    defaults["volatile_db"] = VolatileDBConfig(**volatile_defaults(c))
    values = r.read(
        {
            "supportlonglong": c.boolean,
            "fuse_embedding_table": c.boolean,
            "volatile_db": partial(volatile_db, c),
            "persistent_db": partial(persistent_db, c),
            "update_source": partial(update_source, c),
            "models": partial(_models, c),
        },
        defaults,
        _MISSING_HINTS,
    )
    model_keys = {f.name for f in fields(ModelConfig) if f.init} - {"ignored_keys", "notes"}
    legacy = r.finish(
        _TOP_LEGACY,
        hints={
            **{k: f'"{k}" belongs inside an entry of "models"' for k in model_keys},
            "i64_input_key": 'the ps.json key is "supportlonglong"',
        },
    )
    if any(v is None for v in values.values()):
        return None
    volatile, persistent = values["volatile_db"], values["persistent_db"]
    both = volatile.type is DatabaseType.REDIS_CLUSTER and persistent.type is DatabaseType.ROCKS_DB
    if (
        both
        and volatile.cache_missed_embeddings
        and (volatile.store_compressed != persistent.store_compressed)
    ):
        c.add(
            "persistent_db.store_compressed",
            "must equal volatile_db.store_compressed with cache_missed_embeddings: rows found "
            "in RocksDB are written up to the Redis cluster as they are stored",
        )
        return None
    legacy_keys = tuple((key, root[key]) for key in legacy)
    return PSConfig(
        **values,
        source_path=source_path,
        legacy_keys=legacy_keys,
        repeated_keys=tuple(c.repeated),
    )


def _models(c: Collector, value: Any, where: str) -> tuple[ModelConfig, ...] | None:
    models = c.items(value, where, partial(_model, c))
    if isinstance(value, list) and not value:
        c.add(where, "expected at least one model, found an empty list")
        return None
    if isinstance(value, list):
        first_seen: dict[str, int] = {}
        for i, entry in enumerate(value):
            name = entry.get("model") if isinstance(entry, Mapping) else None
            if not isinstance(name, str) or not name:
                continue
            if name in first_seen:
                c.add(
                    f"{where}[{i}].model",
                    f'duplicate model name "{name}" (also {where}[{first_seen[name]}].model)',
                )
            else:
                first_seen[name] = i
    return models


def _model(c: Collector, value: Any, where: str) -> ModelConfig | None:
    obj = c.object(value, where)
    if obj is None:
        return None
    start = len(c.problems)
    r = ObjectReader(c, obj, where)
    values = r.read(
        {
            "model": partial(c.string, nonempty=True),
            "sparse_files": c.list_of(c.path),
            "dense_file": c.optional_path,
            "network_file": c.optional_path,
            "non_trainable_params_file": c.optional_path,
            "deployed_device_list": c.list_of(c.int_in(AT_LEAST_0)),
            "max_batch_size": c.int_in(),
            "default_value_for_each_table": c.list_of(c.number),
            "maxnum_des_feature_per_sample": c.int_in(AT_LEAST_0),
            "maxnum_catfeature_query_per_table_per_sample": c.list_of(c.int_in()),
            "embedding_vecsize_per_table": c.list_of(c.int_in()),
            "embedding_table_names": c.list_of(partial(c.string, nonempty=True)),
            "label_dim": c.int_in(),
            "slot_num": c.int_in(),
            "gpucache": c.boolean,
            "gpucacheper": c.number_in(UNIT),
            "hit_rate_threshold": c.number_in(AT_LEAST_0),
            "num_of_worker_buffer_in_pool": c.int_in(AT_LEAST_0),
            "num_of_refresher_buffer_in_pool": c.int_in(AT_LEAST_0),
            "cache_refresh_percentage_per_iteration": c.number_in(UNIT),
            "refresh_delay": c.number_in(AT_LEAST_0),
            "refresh_interval": c.int_in(AT_LEAST_0),
            "use_static_table": c.boolean,
            "embedding_cache_type": partial(c.choice, names=EMBEDDING_CACHE_TYPE_NAMES),
            "use_context_stream": c.boolean,
            "use_hctr_cache_implementation": c.boolean,
            "init_ec": c.boolean,
            "enable_pagelock": c.boolean,
            "fp8_quant": c.boolean,
            "use_mixed_precision": c.boolean,
            "thread_pool_size": c.int_in(AT_LEAST_0),
            "storage_precision": partial(c.choice, names=_STORAGE_PRECISION_NAMES),
            "storage_precision_per_table": c.list_of(
                partial(c.choice, names=_STORAGE_PRECISION_NAMES)
            ),
        },
        dataclass_defaults(ModelConfig),
        _MISSING_HINTS,
    )
    ignored = r.finish(_MODEL_IGNORED, _MODEL_HINTS)
    _check_cache_type(c, r, obj, values)
    _check_devices(c, r, obj)
    _check_tables(c, r, obj, values)
    _check_storage(c, r, obj, values)
    if len(c.problems) > start:
        return None
    return ModelConfig(**values, ignored_keys=ignored)


def _check_cache_type(
    c: Collector, r: ObjectReader, obj: Mapping[str, Any], values: dict[str, Any]
) -> None:
    cache_type = values["embedding_cache_type"]
    if (
        values["use_static_table"]
        and "embedding_cache_type" in obj
        and cache_type not in (None, EmbeddingCacheType.STATIC)
    ):
        c.add(
            r.path_of("embedding_cache_type"),
            f'"{cache_type.value}" contradicts "use_static_table": true (HugeCTR silently '
            'uses "static"); remove one of the two',
        )


def _check_devices(c: Collector, r: ObjectReader, obj: Mapping[str, Any]) -> None:
    devices = obj.get("deployed_device_list")
    if not isinstance(devices, list):
        return
    where = r.path_of("deployed_device_list")
    if not devices:
        # HugeCTR takes the last entry as the model's device: an empty list is undefined.
        c.add(where, "expected at least one GPU id, found []")
    for j, device in enumerate(devices):
        if isinstance(device, int) and not isinstance(device, bool) and device in devices[:j]:
            c.add(f"{where}[{j}]", f"GPU {device} is listed twice")


def _count(n: int, noun: str) -> str:
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


def _check_tables(
    c: Collector, r: ObjectReader, obj: Mapping[str, Any], values: dict[str, Any]
) -> None:
    """Check the per-table lists against ``sparse_files``; fit the default values to it.

    Lengths are taken from the raw lists, so a bad item in one list does not hide a length
    mismatch in another.
    """
    names = obj.get("embedding_table_names")
    if isinstance(names, list):
        for j, name in enumerate(names):
            if isinstance(name, str) and name in names[:j]:
                c.add(
                    f"{r.path_of('embedding_table_names')}[{j}]",
                    f'duplicate table name "{name}" (also [{names.index(name)}])',
                )
    sparse_files = obj.get("sparse_files")
    if not isinstance(sparse_files, list):
        return
    n = len(sparse_files)
    if n == 0:
        c.add(r.path_of("sparse_files"), "expected at least one sparse model folder, found []")
        return
    tables = _count(n, "table")
    for key in (
        "embedding_vecsize_per_table",
        "maxnum_catfeature_query_per_table_per_sample",
        "embedding_table_names",
        "storage_precision_per_table",
    ):
        given = obj.get(key)
        if isinstance(given, list) and len(given) != n:
            c.add(
                r.path_of(key),
                f"has {_count(len(given), 'entry')} but sparse_files lists {tables}; "
                "give one per table",
            )
    defaults = values["default_value_for_each_table"]
    if defaults is None or len(defaults) == n:
        return
    # HugeCTR reads the first n values and gives the tables without one 0.0 (its own samples
    # list two values for one table): so here, with a warning.
    if len(defaults) > n:
        change = f"the {_count(len(defaults) - n, 'value')} after the first {n} ignored"
    else:
        change = f"0.0 for the {_count(n - len(defaults), 'table')} without one"
    values["default_value_for_each_table"] = (defaults + (0.0,) * n)[:n]
    values["notes"] = (
        *values.get("notes", ()),
        f"default_value_for_each_table has {_count(len(defaults), 'entry')} for {tables}: "
        f"{change}, as HugeCTR reads it",
    )


def _check_storage(
    c: Collector, r: ObjectReader, obj: Mapping[str, Any], values: dict[str, Any]
) -> None:
    """Check the storage precision against ``fp8_quant`` and each table's dim
    (:func:`~hps_core.config.schema.storage_problems`), once the values it depends on were
    read without problems (their own problems are reported already)."""
    dims = values["embedding_vecsize_per_table"]
    per_table = values["storage_precision_per_table"]
    sparse_files = obj.get("sparse_files")
    if dims is None or not isinstance(sparse_files, list) or len(dims) != len(sparse_files):
        return
    if "storage_precision_per_table" in obj and (per_table is None or len(per_table) != len(dims)):
        return
    if "storage_precision" in obj and values["storage_precision"] is None:
        return
    deciding = ("fp8_quant", "gpucache", "use_static_table", "embedding_cache_type")
    if any(values[key] is None for key in deciding):
        return
    names = values["embedding_table_names"]
    if names is None or len(names) != len(dims):
        names = ()  # bad names are reported already; name the tables as HugeCTR would
    names = names or tuple(default_table_name(i) for i in range(len(dims)))
    static = values["gpucache"] and (
        values["use_static_table"] or values["embedding_cache_type"] is EmbeddingCacheType.STATIC
    )
    for problem in storage_problems(
        dims, values["storage_precision"], per_table, values["fp8_quant"], static, names
    ):
        c.add(r.path_of(problem.where), problem.message)
