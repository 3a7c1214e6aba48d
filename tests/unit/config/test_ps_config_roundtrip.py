"""Writing a config back with ``to_dict``: HugeCTR key names, values kept, parse round-trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from ps_samples import REALISTIC_PS, write_ps

from hps_core.config import PSConfig, load_ps_config, parse_ps_config

BASE = Path("/srv/models/repo")

# Every key HugeCTR's ps.json schema has, per section (from its parser and docs).
HUGECTR_KEYS = {
    "top": {
        "supportlonglong",
        "fuse_embedding_table",
        "volatile_db",
        "persistent_db",
        "update_source",
        "models",
    },
    "model": {
        "model",
        "sparse_files",
        "dense_file",
        "network_file",
        "non_trainable_params_file",
        "num_of_worker_buffer_in_pool",
        "num_of_refresher_buffer_in_pool",
        "deployed_device_list",
        "max_batch_size",
        "default_value_for_each_table",
        "maxnum_des_feature_per_sample",
        "maxnum_catfeature_query_per_table_per_sample",
        "embedding_vecsize_per_table",
        "embedding_table_names",
        "refresh_delay",
        "refresh_interval",
        "hit_rate_threshold",
        "gpucacheper",
        "gpucache",
        "cache_refresh_percentage_per_iteration",
        "label_dim",
        "slot_num",
        "use_static_table",
        "embedding_cache_type",
        "use_context_stream",
        "use_hctr_cache_implementation",
        "init_ec",
        "enable_pagelock",
        "fp8_quant",
        "thread_pool_size",
    },
    "volatile_db": {
        "type",
        "address",
        "user_name",
        "password",
        "num_partitions",
        "allocation_rate",
        "shared_memory_size",
        "shared_memory_name",
        "shared_memory_auto_remove",
        "num_node_connections",
        "max_batch_size",
        "enable_tls",
        "tls_ca_certificate",
        "tls_client_certificate",
        "tls_client_key",
        "tls_server_name_identification",
        "overflow_margin",
        "overflow_policy",
        "overflow_resolution_target",
        "initialize_after_startup",
        "initial_cache_rate",
        "cache_missed_embeddings",
        "update_filters",
    },
    "persistent_db": {
        "type",
        "path",
        "num_threads",
        "read_only",
        "max_batch_size",
        "initialize_after_startup",
        "update_filters",
    },
    "update_source": {
        "type",
        "brokers",
        "metadata_refresh_interval_ms",
        "receive_buffer_size",
        "poll_timeout_ms",
        "max_batch_size",
        "failure_backoff_ms",
        "max_commit_interval",
    },
}


def _reparse(cfg: PSConfig, base: Path, relative_to: Path | None = None) -> PSConfig:
    # Through real JSON text, as `hps repo` would write it.
    return parse_ps_config(json.loads(json.dumps(cfg.to_dict(relative_to))), base)


def test_to_dict_uses_hugectr_key_names_only():
    out = parse_ps_config(REALISTIC_PS, BASE).to_dict()

    assert set(out) == HUGECTR_KEYS["top"]
    for section in ("volatile_db", "persistent_db", "update_source"):
        assert set(out[section]) <= HUGECTR_KEYS[section], section
    for model in out["models"]:
        assert set(model) <= HUGECTR_KEYS["model"]
    assert out["volatile_db"]["type"] == "redis_cluster"
    assert out["models"][1]["embedding_cache_type"] == "uvm"


def test_realistic_file_round_trips(tmp_path):
    cfg = load_ps_config(write_ps(tmp_path, REALISTIC_PS))

    for relative_to in (None, tmp_path):
        again = _reparse(cfg, tmp_path, relative_to)
        assert again == cfg
        assert again.model("wdl").tables == cfg.model("wdl").tables


def test_paths_are_written_relative_to_the_target_folder(tmp_path):
    cfg = load_ps_config(write_ps(tmp_path, REALISTIC_PS))

    models = cfg.to_dict(relative_to=tmp_path)["models"]

    assert models[0]["sparse_files"] == [
        "wdl/1/wdl0_sparse_2000.model",
        "wdl/1/wdl1_sparse_2000.model",
    ]
    assert models[1]["dense_file"] == "/models/dcn/1/_dense_10000.model"  # outside: absolute
    moved = tmp_path / "moved"
    assert _reparse(cfg, moved, tmp_path).model("wdl").sparse_files[0] == (
        moved / "wdl/1/wdl0_sparse_2000.model"
    )


def test_written_file_loads_again(tmp_path):
    cfg = parse_ps_config(REALISTIC_PS, tmp_path)

    path = tmp_path / "out.json"
    path.write_text(json.dumps(cfg.to_dict(relative_to=tmp_path), indent=2))

    assert load_ps_config(path) == cfg


_names = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)
_rel_path = st.lists(_names, min_size=1, max_size=3).map("/".join)
_path = st.one_of(_rel_path, _rel_path.map(lambda p: "/data/" + p))
_unit = st.floats(0.0, 1.0)


@st.composite
def _model(draw: st.DrawFn, name: str) -> dict[str, Any]:
    n = draw(st.integers(1, 5))
    model: dict[str, Any] = {
        "model": name,
        "sparse_files": draw(st.lists(_path, min_size=n, max_size=n)),
        "deployed_device_list": draw(st.lists(st.integers(0, 7), min_size=1, unique=True)),
        "default_value_for_each_table": draw(
            st.lists(st.floats(-1.0, 1.0), min_size=n, max_size=n)
        ),
        "maxnum_catfeature_query_per_table_per_sample": draw(
            st.lists(st.integers(1, 1000), min_size=n, max_size=n)
        ),
        "embedding_vecsize_per_table": draw(st.lists(st.integers(1, 512), min_size=n, max_size=n)),
    }
    optional = {
        "embedding_table_names": st.lists(_names, min_size=n, max_size=n, unique=True),
        "dense_file": _path,
        "network_file": _path,
        "max_batch_size": st.integers(1, 1 << 20),
        "gpucache": st.booleans(),
        "gpucacheper": _unit,
        "hit_rate_threshold": st.floats(0.0, 2.0),
        "num_of_worker_buffer_in_pool": st.integers(1, 64),
        "cache_refresh_percentage_per_iteration": _unit,
        "refresh_delay": st.floats(0.0, 1e4),
        "refresh_interval": st.integers(0, 3600),
        "maxnum_des_feature_per_sample": st.integers(0, 100),
        "label_dim": st.integers(1, 8),
        "embedding_cache_type": st.sampled_from(["dynamic", "static", "uvm", "stochastic"]),
        "use_context_stream": st.booleans(),
        "init_ec": st.booleans(),
        "thread_pool_size": st.integers(1, 64),
    }
    for key in draw(st.sets(st.sampled_from(sorted(optional)))):
        model[key] = draw(optional[key])
    return model


@st.composite
def _ps_documents(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(_names, min_size=1, max_size=3, unique=True))
    doc: dict[str, Any] = {
        "supportlonglong": draw(st.booleans()),
        "models": [draw(_model(name)) for name in names],
    }
    if draw(st.booleans()):
        doc["volatile_db"] = {
            "type": draw(st.sampled_from(["hash_map", "parallel_hash", "redis", "disabled"])),
            "num_partitions": draw(st.integers(1, 64)),
            "overflow_margin": draw(st.integers(1, 1 << 40)),
            "overflow_policy": draw(st.sampled_from(["random", "evict_least_used", "oldest"])),
            "overflow_resolution_target": draw(st.floats(0.01, 0.99)),
            "initial_cache_rate": draw(_unit),
        }
    if draw(st.booleans()):
        doc["persistent_db"] = {"type": "rocksdb", "path": draw(_path)}
    return doc


def _expected(value: Any, key: str) -> Any:
    """What ``to_dict`` must write for an input value of ``key`` (paths are resolved)."""
    if key in ("sparse_files",):
        return [_expected(v, "dense_file") for v in value]
    if key in ("dense_file", "network_file", "path"):
        return value if value.startswith("/") else str(BASE / value)
    return value


@settings(max_examples=60, deadline=None)
@given(_ps_documents())
def test_random_documents_keep_their_values_and_round_trip(doc):
    cfg = parse_ps_config(doc, BASE)
    out = cfg.to_dict()

    assert out["supportlonglong"] == doc["supportlonglong"]
    for given_model, written in zip(doc["models"], out["models"], strict=True):
        for key, value in given_model.items():
            assert written[key] == _expected(value, key), key
    if "persistent_db" in doc:
        assert out["persistent_db"]["path"] == _expected(doc["persistent_db"]["path"], "path")
    assert _reparse(cfg, BASE) == cfg
    assert _reparse(cfg, Path("/elsewhere"), relative_to=BASE) == parse_ps_config(doc, "/elsewhere")
