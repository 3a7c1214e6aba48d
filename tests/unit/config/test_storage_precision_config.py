"""Storage precision in ps.json: HugeCTR's ``fp8_quant`` on static models and this project's
``storage_precision`` / ``storage_precision_per_table`` extensions, resolved into each
``TableConfig.storage``; their problems, round trip and warnings."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from ps_samples import problems_of, write_ps

from hps_core.config import ModelConfig, load_ps_config, parse_ps_config
from hps_core.config.inert import inert_settings
from hps_core.errors import ConfigError
from hps_core.quant import StoragePrecision

FP32, FP16, INT8, FP8 = "fp32", "fp16", "int8", "fp8"

# Two tables as in a Wide&Deep model: a wide one of dim 1 and a deep one of dim 16.
DIMS = [1, 16]


def two_tables(**model: Any) -> dict[str, Any]:
    """A ps.json document with model ``wdl``, tables ``wide`` (dim 1) and ``deep`` (dim 16)."""
    return {
        "supportlonglong": True,
        "models": [
            {
                "model": "wdl",
                "sparse_files": ["wide", "deep"],
                "embedding_table_names": ["wide", "deep"],
                "deployed_device_list": [0],
                "default_value_for_each_table": [0.0, 0.0],
                "maxnum_catfeature_query_per_table_per_sample": [2, 26],
                "embedding_vecsize_per_table": list(DIMS),
                **model,
            }
        ],
    }


def storages(doc: dict[str, Any]) -> list[str]:
    """The storage precision of each table of the document's first model."""
    return [t.storage.value for t in parse_ps_config(doc, "/repo").models[0].tables]


def only_problem(doc: dict[str, Any]) -> tuple[str, str]:
    (problem,) = problems_of(doc)
    return problem.where, problem.message


# ----------------------------------------------------------------------- parsing, resolution


def test_without_any_storage_field_every_table_is_fp32() -> None:
    model = parse_ps_config(two_tables(), "/repo").models[0]
    assert model.storage_precision is None and model.storage_precision_per_table is None
    assert [t.storage for t in model.tables] == [StoragePrecision.FP32] * 2
    assert [t.row_format.row_bytes for t in model.tables] == [4, 64]


@pytest.mark.parametrize("precision", [FP32, FP16, INT8, FP8])
def test_storage_precision_applies_to_every_table(precision: str) -> None:
    doc = two_tables(embedding_vecsize_per_table=[8, 16], storage_precision=precision)
    model = parse_ps_config(doc, "/repo").models[0]
    assert model.storage_precision is StoragePrecision(precision)
    assert [t.storage.value for t in model.tables] == [precision, precision]


def test_per_table_list_sets_each_table() -> None:
    model = parse_ps_config(two_tables(storage_precision_per_table=[FP32, INT8]), "/repo").models[0]
    assert model.storage_precision_per_table == (StoragePrecision.FP32, StoragePrecision.INT8)
    assert [t.storage.value for t in model.tables] == [FP32, INT8]
    assert [t.row_format.row_bytes for t in model.tables] == [4, 16 + 8]


def test_per_table_list_wins_over_storage_precision() -> None:
    doc = two_tables(
        embedding_vecsize_per_table=[8, 16],
        storage_precision=FP16,
        storage_precision_per_table=[FP8, INT8],
    )
    assert storages(doc) == [FP8, INT8]


@pytest.mark.parametrize(
    "static", [{"use_static_table": True}, {"embedding_cache_type": "static"}], ids=str
)
def test_fp8_quant_stores_a_static_models_tables_in_fp8(static: dict[str, Any]) -> None:
    """As in HugeCTR; the wide table of dim 1, whose FP8 row (1 code padded to 4 bytes and a
    4-byte scale) would be twice its FP32 row, stays FP32."""
    assert storages(two_tables(fp8_quant=True, **static)) == [FP32, FP8]
    dims = {"embedding_vecsize_per_table": [3, 16]}  # 3 codes + pad + scale: 8 < 12 bytes
    assert storages(two_tables(fp8_quant=True, **static, **dims)) == [FP8, FP8]
    assert storages(two_tables(fp8_quant=False, **static)) == [FP32, FP32]


@pytest.mark.parametrize(
    "cache",
    [{}, {"embedding_cache_type": "uvm"}, {"use_static_table": True, "gpucache": False}],
    ids=["dynamic", "uvm", "static-without-gpucache"],
)
def test_fp8_quant_does_nothing_without_static_tables(cache: dict[str, Any]) -> None:
    assert storages(two_tables(fp8_quant=True, **cache)) == [FP32, FP32]


def test_storage_precision_wins_over_fp8_quant_on_a_dynamic_model() -> None:
    assert storages(two_tables(fp8_quant=True, storage_precision_per_table=[FP32, FP16])) == [
        FP32,
        FP16,
    ]


def test_fp8_quant_agrees_with_fields_that_name_what_it_gives() -> None:
    """No contradiction: fp8 for the deep table, fp32 for the wide one fp8_quant leaves."""
    doc = two_tables(fp8_quant=True, use_static_table=True, storage_precision_per_table=[FP32, FP8])
    assert storages(doc) == [FP32, FP8]
    doc = two_tables(
        fp8_quant=True,
        use_static_table=True,
        storage_precision=FP8,
        embedding_vecsize_per_table=[4, 16],
    )
    assert storages(doc) == [FP8, FP8]


def test_model_built_in_code_resolves_and_checks_storage() -> None:
    common: dict[str, Any] = {
        "model": "m",
        "sparse_files": (Path("/a"), Path("/b")),
        "deployed_device_list": (0,),
        "default_value_for_each_table": (0.0, 0.0),
        "maxnum_catfeature_query_per_table_per_sample": (1, 1),
        "embedding_vecsize_per_table": (1, 16),
    }
    model = ModelConfig(**common, storage_precision_per_table=("fp32", "int8"))
    assert model.storage_precision_per_table == (StoragePrecision.FP32, StoragePrecision.INT8)
    assert [t.storage for t in model.tables] == [StoragePrecision.FP32, StoragePrecision.INT8]
    assert [t.storage.value for t in ModelConfig(**common, fp8_quant=True).tables] == [FP32] * 2
    static = ModelConfig(**common, fp8_quant=True, use_static_table=True)
    assert [t.storage.value for t in static.tables] == [FP32, FP8]

    with pytest.raises(ConfigError) as info:
        ModelConfig(**common, storage_precision="int8")
    assert [p.where for p in info.value.problems] == ["storage_precision"]
    assert 'table "sparse_embedding0" (dim 1) in 12 bytes' in info.value.problems[0].message
    with pytest.raises(ConfigError) as info:
        ModelConfig(**common, storage_precision_per_table=("fp32",))
    assert [p.where for p in info.value.problems] == ["storage_precision_per_table"]
    with pytest.raises(ConfigError) as info:
        ModelConfig(**common, storage_precision_per_table=("fp32", "bf16"))
    assert [p.where for p in info.value.problems] == ["storage_precision_per_table[1]"]
    assert '"fp32", "fp16", "int8", "fp8"' in info.value.problems[0].message


# ----------------------------------------------------------------------- round trip


def test_a_hugectr_file_round_trips_without_extension_keys(tmp_path: Path) -> None:
    doc = two_tables(fp8_quant=True, use_static_table=True)
    cfg = load_ps_config(write_ps(tmp_path, doc))
    written = cfg.to_dict(relative_to=tmp_path)["models"][0]
    assert "storage_precision" not in written
    assert "storage_precision_per_table" not in written
    assert written["fp8_quant"] is True
    again = parse_ps_config(json.loads(json.dumps(cfg.to_dict(tmp_path))), tmp_path)
    assert again == cfg
    assert [t.storage.value for t in again.models[0].tables] == [FP32, FP8]


@pytest.mark.parametrize(
    "fields",
    [
        {"storage_precision": FP16, "embedding_vecsize_per_table": [2, 16]},
        {"storage_precision_per_table": [FP32, INT8]},
        {"storage_precision": INT8, "storage_precision_per_table": [FP32, FP8]},
    ],
    ids=["model", "per-table", "both"],
)
def test_extension_fields_are_written_back_as_given(tmp_path: Path, fields: dict[str, Any]) -> None:
    cfg = load_ps_config(write_ps(tmp_path, two_tables(**fields)))
    written = cfg.to_dict(relative_to=tmp_path)["models"][0]
    for key in ("storage_precision", "storage_precision_per_table"):
        assert written.get(key) == fields.get(key), key
    again = parse_ps_config(json.loads(json.dumps(cfg.to_dict(tmp_path))), tmp_path)
    assert again == cfg
    assert again.models[0].tables == cfg.models[0].tables
    assert [t.storage for t in again.models[0].tables] == [t.storage for t in cfg.models[0].tables]


# ----------------------------------------------------------------------- problems

ALLOWED = '"fp32", "fp16", "int8", "fp8"'


@pytest.mark.parametrize(
    ("fields", "where", "message"),
    [
        (
            {"storage_precision": "FP-16"},
            "models[0].storage_precision",
            f'unknown value "FP-16" (did you mean "fp16"?); expected one of {ALLOWED}',
        ),
        (
            {"storage_precision": "bfloat16"},
            "models[0].storage_precision",
            f'unknown value "bfloat16"; expected one of {ALLOWED}',
        ),
        (
            {"storage_precision_per_table": [FP32, "int4"]},
            "models[0].storage_precision_per_table[1]",
            f'unknown value "int4" (did you mean "int8"?); expected one of {ALLOWED}',
        ),
        (
            {"storage_precision": 16},
            "models[0].storage_precision",
            "expected a string, found 16",
        ),
        (
            {"storage_precision_per_table": FP16},
            "models[0].storage_precision_per_table",
            'expected a list, found the string "fp16"',
        ),
    ],
)
def test_unknown_precision_lists_the_allowed_values(
    fields: dict[str, Any], where: str, message: str
) -> None:
    assert only_problem(two_tables(**fields)) == (where, message)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ([FP32], "has 1 entry but sparse_files lists 2 tables; give one per table"),
        ([FP32, FP16, FP8], "has 3 entries but sparse_files lists 2 tables; give one per table"),
    ],
)
def test_per_table_list_of_the_wrong_length(given: list[str], message: str) -> None:
    """Same message as the other per-table lists (embedding_vecsize_per_table)."""
    assert only_problem(two_tables(storage_precision_per_table=given)) == (
        "models[0].storage_precision_per_table",
        message,
    )
    vecsize = only_problem(two_tables(embedding_vecsize_per_table=[16] * len(given)))
    assert vecsize == ("models[0].embedding_vecsize_per_table", message)


@pytest.mark.parametrize(
    ("fields", "where", "message"),
    [
        (
            {"storage_precision": INT8},
            "models[0].storage_precision",
            '"int8" contradicts "fp8_quant": true, which stores the tables of a static model '
            'in fp8 as HugeCTR does; remove "fp8_quant" to store table "deep" in int8, or '
            'remove "storage_precision" to keep fp8',
        ),
        (
            {"storage_precision": FP32, "embedding_vecsize_per_table": [8, 16]},
            "models[0].storage_precision",
            '"fp32" contradicts "fp8_quant": true, which stores the tables of a static model '
            'in fp8 as HugeCTR does; remove "fp8_quant" to store tables "wide", "deep" in fp32, '
            'or remove "storage_precision" to keep fp8',
        ),
        (
            {"storage_precision_per_table": [FP32, FP16]},
            "models[0].storage_precision_per_table[1]",
            '"fp16" contradicts "fp8_quant": true, which stores the tables of a static model '
            'in fp8 as HugeCTR does; remove "fp8_quant" to store table "deep" in fp16, or '
            'remove "storage_precision_per_table" to keep fp8',
        ),
    ],
    ids=["model", "model-fp32", "per-table"],
)
def test_fp8_quant_contradicted_on_a_static_model(
    fields: dict[str, Any], where: str, message: str
) -> None:
    doc = two_tables(fp8_quant=True, use_static_table=True, **fields)
    assert only_problem(doc) == (where, message)
    # Not a contradiction where fp8_quant has no effect: a dynamic cache.
    del doc["models"][0]["use_static_table"]
    try:
        parse_ps_config(doc, "/repo")
    except ConfigError as exc:  # int8 at dim 1: refused for its size, not as a contradiction
        assert [p.message for p in exc.problems if "contradicts" in p.message] == []


# (precision, dim, its row's bytes): every dim at which the row is not smaller than 4 * dim.
NOT_SMALLER = [(FP16, 1, 4), (INT8, 1, 12), (INT8, 2, 12), (INT8, 3, 12), (FP8, 1, 8), (FP8, 2, 8)]
SCALES = {
    FP16: "",
    INT8: ", and a 4-byte scale and a 4-byte bias follow the values",
    FP8: ", and a 4-byte scale follows the values",
}


@pytest.mark.parametrize(("precision", "dim", "row_bytes"), NOT_SMALLER, ids=str)
def test_precision_whose_row_is_not_smaller_is_refused(
    precision: str, dim: int, row_bytes: int
) -> None:
    reason = (
        f'{precision} would store table "wide" (dim {dim}) in {row_bytes} bytes per row, not '
        f"fewer than its {4 * dim} bytes in fp32 (rows are padded to 4 bytes{SCALES[precision]})"
    )
    dims = {"embedding_vecsize_per_table": [dim, 16]}
    assert only_problem(two_tables(storage_precision=precision, **dims)) == (
        "models[0].storage_precision",
        f'{reason}; keep it in fp32 with "storage_precision_per_table", one precision per table',
    )
    assert only_problem(two_tables(storage_precision_per_table=[precision, FP32], **dims)) == (
        "models[0].storage_precision_per_table[0]",
        f'{reason}; write "fp32" for it',
    )


@pytest.mark.parametrize(("precision", "dim"), [(FP16, 2), (INT8, 4), (FP8, 3)], ids=str)
def test_the_smallest_dim_each_precision_compresses_is_accepted(precision: str, dim: int) -> None:
    doc = two_tables(storage_precision=precision, embedding_vecsize_per_table=[dim, 16])
    (wide, _) = parse_ps_config(doc, "/repo").models[0].tables
    assert wide.storage.value == precision
    assert wide.row_format.row_bytes < 4 * dim


def test_storage_problems_come_with_the_others(tmp_path: Path) -> None:
    """Loading the file refuses them, all problems at once, each at its path."""
    doc = two_tables(storage_precision_per_table=[INT8, "fp4"], gpucacheper=2)
    second = copy.deepcopy(doc["models"][0])
    second.update(model="dcn", storage_precision=INT8, storage_precision_per_table=[FP16, FP8])
    doc["models"].append(second)
    with pytest.raises(ConfigError) as info:
        load_ps_config(write_ps(tmp_path, doc))
    assert [p.where for p in info.value.problems] == [
        "models[0].gpucacheper",
        "models[0].storage_precision_per_table[1]",
        "models[1].gpucacheper",
        "models[1].storage_precision_per_table[0]",
    ]
    # Model 0's int8 wide table is not reported while the list has an unknown value: the
    # list is checked once it parses.
    assert 'fp16 would store table "wide" (dim 1) in 4 bytes' in str(info.value)


# ----------------------------------------------------------------------- warnings


def warnings_of(doc: dict[str, Any]) -> list[str]:
    return inert_settings(parse_ps_config(doc, "/repo"))


def test_fp8_quant_is_warned_about_only_without_static_tables() -> None:
    dynamic = warnings_of(two_tables(fp8_quant=True))
    assert dynamic == [
        "models[0].fp8_quant = true (model 'wdl'): accepted without effect: it applies to "
        'static tables only (embedding_cache_type "static" or use_static_table, with gpucache), '
        "as in HugeCTR, which quantises them to FP8 with per-row scales; this model has none. "
        '"storage_precision" is this project\'s way to compress the tables of a dynamic cache'
    ]
    assert warnings_of(two_tables(fp8_quant=True, use_static_table=True, gpucache=False)) == dynamic
    assert warnings_of(two_tables(fp8_quant=False, use_static_table=True)) == []
    assert warnings_of(two_tables(storage_precision_per_table=[FP32, FP8])) == []


def test_fp8_quant_on_a_static_model_names_the_tables_it_leaves_in_fp32() -> None:
    assert warnings_of(two_tables(fp8_quant=True, use_static_table=True)) == [
        "models[0].fp8_quant = true (model 'wdl'): table 'wide' (dim 1) stays FP32: its FP8 "
        "row would take 8 bytes, its FP32 row takes 4"
    ]
    every_table_fp8 = two_tables(
        fp8_quant=True, embedding_cache_type="static", embedding_vecsize_per_table=[3, 16]
    )
    assert warnings_of(every_table_fp8) == []
    named = two_tables(
        fp8_quant=True, use_static_table=True, storage_precision_per_table=[FP32, FP8]
    )
    assert warnings_of(named) == []  # the file names fp32 for it: nothing to tell


# --------------------------------------------------------------- store_compressed (databases)


def with_databases(volatile: dict[str, Any], persistent: dict[str, Any]) -> dict[str, Any]:
    return {**two_tables(storage_precision_per_table=[FP32, FP16]), "volatile_db": volatile,
            "persistent_db": persistent}  # fmt: skip


REDIS = {"type": "redis_cluster", "address": "127.0.0.1:7000"}
ROCKS = {"type": "rocks_db", "path": "/tmp/db"}


def test_store_compressed_is_read_and_written_back_only_when_set(tmp_path: Path) -> None:
    doc = with_databases({**REDIS, "store_compressed": True}, {**ROCKS, "store_compressed": True})
    cfg = parse_ps_config(doc, tmp_path)
    assert cfg.volatile_db.store_compressed and cfg.persistent_db.store_compressed
    written = cfg.to_dict(tmp_path)
    assert written["volatile_db"]["store_compressed"] is True
    assert written["persistent_db"]["store_compressed"] is True
    again = parse_ps_config(json.loads(json.dumps(written)), tmp_path)
    assert again.volatile_db == cfg.volatile_db and again.persistent_db == cfg.persistent_db
    plain = parse_ps_config(with_databases(REDIS, ROCKS), tmp_path).to_dict(tmp_path)
    assert "store_compressed" not in plain["volatile_db"]
    assert "store_compressed" not in plain["persistent_db"]


@pytest.mark.parametrize(
    ("volatile", "persistent", "where", "message"),
    [
        ({"type": "hash_map", "store_compressed": True}, ROCKS, "volatile_db.store_compressed",
         "applies to a redis_cluster only: the host tier (type 'hash_map') holds every table"),
        (REDIS, {"type": "disabled", "store_compressed": True}, "persistent_db.store_compressed",
         "applies to a rocks_db only: persistent_db is disabled"),
        ({**REDIS, "cache_missed_embeddings": True, "store_compressed": True}, ROCKS,
         "persistent_db.store_compressed",
         "must equal volatile_db.store_compressed with cache_missed_embeddings"),
        (REDIS, {**ROCKS, "store_compressed": "yes"}, "persistent_db.store_compressed",
         'expected true or false, found the string "yes"'),
    ],
)  # fmt: skip
def test_store_compressed_where_it_does_not_apply_is_refused(
    volatile: dict[str, Any], persistent: dict[str, Any], where: str, message: str
) -> None:
    got_where, got = only_problem(with_databases(volatile, persistent))
    assert got_where == where and message in got


def test_databases_may_differ_without_cache_missed_embeddings(tmp_path: Path) -> None:
    cfg = parse_ps_config(with_databases(REDIS, {**ROCKS, "store_compressed": True}), tmp_path)
    assert not cfg.volatile_db.store_compressed and cfg.persistent_db.store_compressed
