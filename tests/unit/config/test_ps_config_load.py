"""Loading valid ps.json files: values, paths, tables, defaults and HugeCTR's aliases."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from ps_samples import write_ps

from hps_core.config import (
    DatabaseType,
    EmbeddingCacheType,
    ModelConfig,
    OverflowPolicy,
    TableConfig,
    UpdateSourceType,
    load_ps_config,
    parse_ps_config,
)
from hps_core.config.inert import inert_settings
from hps_core.errors import ConfigError


def test_realistic_file_values(tmp_path, realistic):
    cfg = load_ps_config(write_ps(tmp_path, realistic))

    assert cfg.source_path == tmp_path / "ps.json"
    assert cfg.supportlonglong is True
    assert cfg.model_names == ("wdl", "dcn")

    vdb = cfg.volatile_db
    assert vdb.type is DatabaseType.REDIS_CLUSTER
    assert vdb.address == "127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005"
    assert (vdb.num_partitions, vdb.max_batch_size) == (8, 100000)
    assert vdb.overflow_margin == 10000000
    assert vdb.overflow_policy is OverflowPolicy.EVICT_OLDEST
    assert (vdb.initial_cache_rate, vdb.cache_missed_embeddings) == (0.5, True)
    assert vdb.update_filters == (".+",)

    pdb = cfg.persistent_db
    assert pdb.type is DatabaseType.ROCKS_DB
    assert pdb.path == Path("/var/lib/hps/rocksdb")
    assert (pdb.num_threads, pdb.read_only, pdb.max_batch_size) == (8, True, 50000)

    src = cfg.update_source
    assert src.type is UpdateSourceType.KAFKA_MESSAGE_QUEUE
    assert src.brokers == "10.0.0.5:9092;10.0.0.6:9092"
    assert (src.poll_timeout_ms, src.max_batch_size) == (250, 4096)

    wdl = cfg.model("wdl")
    assert wdl.name == wdl.model == "wdl"
    assert wdl.dense_file == tmp_path / "wdl/1/wdl_dense_2000.model"
    assert wdl.network_file == tmp_path / "wdl/1/wdl.json"
    assert (wdl.num_of_worker_buffer_in_pool, wdl.num_of_refresher_buffer_in_pool) == (4, 2)
    assert wdl.maxnum_des_feature_per_sample == 13
    assert (wdl.gpucache, wdl.gpucacheper, wdl.hit_rate_threshold) == (True, 0.1, 0.9)
    assert wdl.cache_refresh_percentage_per_iteration == 0.2
    assert (wdl.label_dim, wdl.slot_num, wdl.use_context_stream) == (1, 28, False)
    assert wdl.embedding_cache_type is EmbeddingCacheType.DYNAMIC

    dcn = cfg.model("dcn")
    assert dcn.deployed_device_list == (1, 0)
    assert dcn.hit_rate_threshold == 1.1  # above 1 accepted (HugeCTR: every insert synchronous)
    assert dcn.embedding_cache_type is EmbeddingCacheType.UVM


def test_tables_gather_the_parallel_lists(tmp_path, realistic):
    cfg = load_ps_config(write_ps(tmp_path, realistic))

    assert cfg.model("wdl").tables == (
        TableConfig(0, "wide_table", tmp_path / "wdl/1/wdl0_sparse_2000.model", 1, 0.0, 2),
        TableConfig(1, "deep_table", tmp_path / "wdl/1/wdl1_sparse_2000.model", 16, 0.25, 26),
    )
    (table,) = cfg.model("dcn").tables
    assert table == TableConfig(
        0, "sparse_embedding0", Path("/models/dcn/1/0_sparse_10000.model"), 16, 0.0, 26
    )


def test_relative_paths_follow_the_file_not_the_working_directory(tmp_path, realistic, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    realistic["models"][0]["sparse_files"][0] = "../shared/./wdl0_sparse.model"
    write_ps(repo, realistic)

    cfg = load_ps_config("../repo/ps.json")

    assert cfg.source_path == repo / "ps.json"
    wdl = cfg.model("wdl")
    assert wdl.tables[0].sparse_file == tmp_path / "shared/wdl0_sparse.model"
    assert wdl.tables[1].sparse_file == repo / "wdl/1/wdl1_sparse_2000.model"
    assert cfg.model("dcn").dense_file == Path("/models/dcn/1/_dense_10000.model")


def test_parse_resolves_against_given_folder(realistic):
    cfg = parse_ps_config(realistic, "/srv/triton/models", source="wdl_ps.json")

    assert cfg.source_path == Path("/srv/triton/models/wdl_ps.json")
    assert cfg.model("wdl").sparse_files[0] == Path(
        "/srv/triton/models/wdl/1/wdl0_sparse_2000.model"
    )


def test_minimal_file_gets_hugectr_defaults(minimal):
    cfg = parse_ps_config(minimal, "/repo")
    model = cfg.model("tiny")

    # Defaults read off HugeCTR v24.06's parameter_server_config and parameter structs.
    expected_model = {
        "max_batch_size": 64,
        "gpucache": True,
        "gpucacheper": 0.2,
        "hit_rate_threshold": 0.9,
        "dense_file": None,
        "network_file": None,
        "num_of_worker_buffer_in_pool": 1,
        "num_of_refresher_buffer_in_pool": 1,
        "cache_refresh_percentage_per_iteration": 0.0,
        "maxnum_des_feature_per_sample": 26,
        "refresh_delay": 0.0,
        "refresh_interval": 0,
        "embedding_table_names": ("sparse_embedding0",),
        "use_static_table": False,
        "embedding_cache_type": EmbeddingCacheType.DYNAMIC,
        "use_context_stream": True,
        # Not read by HugeCTR's parser (its struct's 1 and 10 never apply): None, not given.
        "label_dim": None,
        "slot_num": None,
        "use_hctr_cache_implementation": True,
        "init_ec": True,
        "enable_pagelock": False,
        "fp8_quant": False,
        "thread_pool_size": 16,
    }
    assert {k: getattr(model, k) for k in expected_model} == expected_model
    assert cfg.supportlonglong is False
    assert cfg.fuse_embedding_table is False

    vdb = cfg.volatile_db
    expected_volatile = {
        "type": DatabaseType.PARALLEL_HASH_MAP,  # no volatile_db section at all
        "address": "127.0.0.1:7000",
        "user_name": "default",
        "password": "",
        "allocation_rate": 268435456,
        "shared_memory_size": 17179869184,
        "shared_memory_name": "hctr_mp_hash_map_database",
        "shared_memory_auto_remove": True,
        "num_node_connections": 5,
        "max_batch_size": 65536,
        "enable_tls": False,
        "tls_ca_certificate": Path("/repo/cacertbundle.crt"),
        "tls_server_name_identification": "redis.localhost",
        "overflow_margin": None,
        "overflow_policy": OverflowPolicy.EVICT_RANDOM,
        "overflow_resolution_target": 0.8,
        "initial_cache_rate": 1.0,
        "cache_missed_embeddings": False,
        "update_filters": ("^hps_.+$",),
    }
    assert {k: getattr(vdb, k) for k in expected_volatile} == expected_volatile
    assert vdb.num_partitions is None
    assert 1 <= vdb.resolved_num_partitions <= 16

    pdb = cfg.persistent_db
    assert pdb.type is DatabaseType.DISABLED
    assert pdb.path == Path(tempfile.gettempdir()) / "rocksdb"
    assert (pdb.num_threads, pdb.read_only, pdb.max_batch_size) == (16, False, 65536)

    src = cfg.update_source
    assert src.type is UpdateSourceType.NULL
    expected_source = (
        "127.0.0.1:9092",
        30000,
        262144,
        500,
        8192,
        50,
        32,
    )
    assert (
        src.brokers,
        src.metadata_refresh_interval_ms,
        src.receive_buffer_size,
        src.poll_timeout_ms,
        src.max_batch_size,
        src.failure_backoff_ms,
        src.max_commit_interval,
    ) == expected_source


def test_volatile_section_without_type_is_disabled(minimal):
    minimal["volatile_db"] = {"num_partitions": 4}

    cfg = parse_ps_config(minimal, "/repo")

    assert cfg.volatile_db.type is DatabaseType.DISABLED
    assert cfg.volatile_db.resolved_num_partitions == 4


@pytest.mark.parametrize(
    ("spelling", "member"),
    [
        ("disabled", DatabaseType.DISABLED),
        ("disable", DatabaseType.DISABLED),
        ("none", DatabaseType.DISABLED),
        ("hash_map", DatabaseType.HASH_MAP),
        ("hashmap", DatabaseType.HASH_MAP),
        ("hash", DatabaseType.HASH_MAP),
        ("map", DatabaseType.HASH_MAP),
        ("parallel_hash_map", DatabaseType.PARALLEL_HASH_MAP),
        ("parallel_hashmap", DatabaseType.PARALLEL_HASH_MAP),
        ("parallel_hash", DatabaseType.PARALLEL_HASH_MAP),
        ("parallel_map", DatabaseType.PARALLEL_HASH_MAP),
        ("multi_process_hash_map", DatabaseType.MULTI_PROCESS_HASH_MAP),
        ("multi_process_hashmap", DatabaseType.MULTI_PROCESS_HASH_MAP),
        ("multi_process_hash", DatabaseType.MULTI_PROCESS_HASH_MAP),
        ("multi_process_map", DatabaseType.MULTI_PROCESS_HASH_MAP),
        ("redis_cluster", DatabaseType.REDIS_CLUSTER),
        ("redis", DatabaseType.REDIS_CLUSTER),
    ],
)
def test_volatile_type_aliases(minimal, spelling, member):
    minimal["volatile_db"] = {"type": spelling}

    assert parse_ps_config(minimal, "/repo").volatile_db.type is member


@pytest.mark.parametrize(
    ("spelling", "member"),
    [
        ("rocks_db", DatabaseType.ROCKS_DB),
        ("rocksdb", DatabaseType.ROCKS_DB),
        ("rocks", DatabaseType.ROCKS_DB),
        ("none", DatabaseType.DISABLED),
        ("disabled", DatabaseType.DISABLED),
    ],
)
def test_persistent_type_aliases(minimal, spelling, member):
    minimal["persistent_db"] = {"type": spelling}

    assert parse_ps_config(minimal, "/repo").persistent_db.type is member


@pytest.mark.parametrize(
    ("spelling", "member"),
    [
        ("evict_random", OverflowPolicy.EVICT_RANDOM),
        ("random", OverflowPolicy.EVICT_RANDOM),
        ("evict_least_used", OverflowPolicy.EVICT_LEAST_USED),
        ("least_used", OverflowPolicy.EVICT_LEAST_USED),
        ("evict_oldest", OverflowPolicy.EVICT_OLDEST),
        ("oldest", OverflowPolicy.EVICT_OLDEST),
    ],
)
def test_overflow_policy_aliases(minimal, spelling, member):
    minimal["volatile_db"] = {"type": "hash_map", "overflow_policy": spelling}

    assert parse_ps_config(minimal, "/repo").volatile_db.overflow_policy is member


@pytest.mark.parametrize(
    ("spelling", "member"),
    [
        ("null", UpdateSourceType.NULL),
        ("none", UpdateSourceType.NULL),
        ("kafka_message_queue", UpdateSourceType.KAFKA_MESSAGE_QUEUE),
        ("kafka_mq", UpdateSourceType.KAFKA_MESSAGE_QUEUE),
        ("kafka", UpdateSourceType.KAFKA_MESSAGE_QUEUE),
    ],
)
def test_update_source_aliases(minimal, spelling, member):
    minimal["update_source"] = {"type": spelling}

    assert parse_ps_config(minimal, "/repo").update_source.type is member


@pytest.mark.parametrize("cache_type", ["dynamic", "static", "uvm", "stochastic"])
def test_embedding_cache_types(minimal, cache_type):
    minimal["models"][0]["embedding_cache_type"] = cache_type

    model = parse_ps_config(minimal, "/repo").model("tiny")

    assert model.embedding_cache_type is EmbeddingCacheType(cache_type)


@pytest.mark.parametrize("explicit", [None, "static"])
def test_use_static_table_means_static_cache(minimal, explicit):
    minimal["models"][0]["use_static_table"] = True
    if explicit is not None:
        minimal["models"][0]["embedding_cache_type"] = explicit

    model = parse_ps_config(minimal, "/repo").model("tiny")

    assert model.use_static_table is True
    assert model.embedding_cache_type is EmbeddingCacheType.STATIC


@pytest.mark.parametrize(
    ("n_tables", "given", "note"),
    [
        (2, [0.0], "0.0 for the 1 table without one"),
        (7, [0.5, 0.25], "0.0 for the 5 tables without one"),
        (1, [0.0, 0.0], "the 1 value after the first 1 ignored"),  # HugeCTR's DLRM sample
        (3, [1.0, 2.0, 3.0, 4.0, 5.0], "the 2 values after the first 3 ignored"),
    ],
)
def test_default_values_are_fitted_to_the_tables_like_hugectr_with_a_warning(
    minimal, n_tables, given, note
):
    model = minimal["models"][0]
    model["sparse_files"] = [f"t{i}" for i in range(n_tables)]
    model["maxnum_catfeature_query_per_table_per_sample"] = [1] * n_tables
    model["embedding_vecsize_per_table"] = list(range(4, 4 + n_tables))
    model["default_value_for_each_table"] = given

    config = parse_ps_config(minimal, "/repo")
    parsed = config.model("tiny")

    want = (tuple(given) + (0.0,) * n_tables)[:n_tables]
    assert parsed.default_value_for_each_table == want
    assert [t.default_value for t in parsed.tables] == list(want)
    assert [t.dim for t in parsed.tables] == list(range(4, 4 + n_tables))
    tables = f"{n_tables} table{'s' if n_tables > 1 else ''}"
    assert (
        f"models[0].default_value_for_each_table has {len(given)} "
        f"entr{'y' if len(given) == 1 else 'ies'} for {tables}: "
        f"{note}, as HugeCTR reads it (model 'tiny')"
    ) in inert_settings(config)


def test_legacy_top_level_keys_are_accepted_with_a_warning(minimal):
    minimal["db_type"] = "local"  # HugeCTR's DLRM inference sample still writes it

    config = parse_ps_config(minimal, "/repo")

    assert inert_settings(config) == [
        "db_type = local: accepted without effect: a key of HugeCTR before v3.3, which "
        "ignores it since; volatile_db and persistent_db configure the tiers"
    ]


def test_integral_floats_are_integers(minimal):
    minimal["models"][0]["max_batch_size"] = 1e6
    minimal["models"][0]["embedding_vecsize_per_table"] = [16.0]

    model = parse_ps_config(minimal, "/repo").model("tiny")

    assert model.max_batch_size == 1_000_000 and isinstance(model.max_batch_size, int)
    assert model.tables[0].dim == 16 and isinstance(model.tables[0].dim, int)


def test_integers_are_accepted_for_floats(minimal):
    minimal["models"][0].update({"gpucacheper": 1, "refresh_delay": 3})

    model = parse_ps_config(minimal, "/repo").model("tiny")

    assert (model.gpucacheper, model.refresh_delay) == (1.0, 3.0)
    assert isinstance(model.gpucacheper, float)


def test_known_but_ignored_keys_are_accepted_and_listed(minimal):
    minimal["models"][0].update({"cat_feature_num": 26, "use_cuda_graph": True, "slots": 26})
    minimal["volatile_db"] = {"type": "hash_map", "max_get_batch_size": 10000}
    minimal["update_source"] = {"type": "null", "max_receive_buffer_size": 2000}

    cfg = parse_ps_config(minimal, "/repo")

    assert cfg.model("tiny").ignored_keys == ("cat_feature_num", "use_cuda_graph", "slots")
    assert cfg.volatile_db.ignored_keys == ("max_get_batch_size",)
    assert cfg.update_source.ignored_keys == ("max_receive_buffer_size",)
    assert cfg.persistent_db.ignored_keys == ()


def test_key_repeated_with_the_same_value_is_accepted(tmp_path, minimal):
    # HugeCTR's own docs sample repeats "use_static_table": false inside one model.
    text = (
        write_ps(tmp_path, minimal)
        .read_text()
        .replace(
            '"model": "tiny",',
            '"model": "tiny", "use_static_table": false, "use_static_table": false,',
        )
    )
    (tmp_path / "ps.json").write_text(text)

    assert load_ps_config(tmp_path / "ps.json").model("tiny").use_static_table is False


def test_unknown_model_names_the_known_ones(realistic):
    cfg = parse_ps_config(realistic, "/repo")

    with pytest.raises(ConfigError) as info:
        cfg.model("wld")

    (problem,) = info.value.problems
    assert problem.where == "models"
    assert 'no model named "wld"' in problem.message
    assert 'did you mean "wdl"' in problem.message
    assert '"wdl", "dcn"' in problem.message


def test_configs_are_frozen(realistic):
    cfg = parse_ps_config(realistic, "/repo")

    with pytest.raises(AttributeError):
        cfg.model("wdl").gpucacheper = 0.9  # type: ignore[misc]


def test_fuse_embedding_table_is_read_at_the_top_level(minimal):
    minimal["fuse_embedding_table"] = True

    assert parse_ps_config(minimal, "/repo").fuse_embedding_table is True


def test_model_built_in_code_gets_hugectr_table_names_and_checks_lengths():
    model = ModelConfig(
        model="m",
        sparse_files=(Path("/a"), Path("/b")),
        deployed_device_list=(0,),
        default_value_for_each_table=(0.0, 1.0),
        maxnum_catfeature_query_per_table_per_sample=(1, 2),
        embedding_vecsize_per_table=(4, 8),
        use_static_table=True,
    )
    assert [t.name for t in model.tables] == ["sparse_embedding0", "sparse_embedding1"]
    assert model.embedding_cache_type is EmbeddingCacheType.STATIC

    with pytest.raises(ConfigError) as info:
        ModelConfig(
            model="m",
            sparse_files=(Path("/a"), Path("/b")),
            deployed_device_list=(0,),
            default_value_for_each_table=(0.0,),
            maxnum_catfeature_query_per_table_per_sample=(1, 2),
            embedding_vecsize_per_table=(4, 8, 16),
        )
    assert {p.where for p in info.value.problems} == {
        "default_value_for_each_table",
        "embedding_vecsize_per_table",
    }
