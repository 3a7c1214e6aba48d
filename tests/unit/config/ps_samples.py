"""ps.json samples and helpers shared by the config tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hps_core.config import parse_ps_config
from hps_core.errors import ConfigError, Problem

# Shaped like the ps.json files of HugeCTR's hps backend samples and its database-backend
# docs: a two-table Wide&Deep model with relative paths, a one-table DCN model with absolute
# paths, a Redis volatile tier, RocksDB and Kafka.
REALISTIC_PS: dict[str, Any] = {
    "supportlonglong": True,
    "volatile_db": {
        "type": "redis_cluster",
        "address": "127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005",
        "user_name": "default",
        "password": "",
        "num_partitions": 8,
        "max_batch_size": 100000,
        "overflow_margin": 10000000,
        "overflow_policy": "evict_oldest",
        "overflow_resolution_target": 0.8,
        "initial_cache_rate": 0.5,
        "cache_missed_embeddings": True,
        "update_filters": [".+"],
    },
    "persistent_db": {
        "type": "rocks_db",
        "path": "/var/lib/hps/rocksdb",
        "num_threads": 8,
        "read_only": True,
        "max_batch_size": 50000,
        "update_filters": ["^hps_wdl$"],
    },
    "update_source": {
        "type": "kafka_message_queue",
        "brokers": "10.0.0.5:9092;10.0.0.6:9092",
        "poll_timeout_ms": 250,
        "max_batch_size": 4096,
    },
    "models": [
        {
            "model": "wdl",
            "sparse_files": ["wdl/1/wdl0_sparse_2000.model", "wdl/1/wdl1_sparse_2000.model"],
            "dense_file": "wdl/1/wdl_dense_2000.model",
            "network_file": "wdl/1/wdl.json",
            "num_of_worker_buffer_in_pool": 4,
            "num_of_refresher_buffer_in_pool": 2,
            "deployed_device_list": [0],
            "max_batch_size": 64,
            "default_value_for_each_table": [0.0, 0.25],
            "maxnum_des_feature_per_sample": 13,
            "maxnum_catfeature_query_per_table_per_sample": [2, 26],
            "embedding_vecsize_per_table": [1, 16],
            "embedding_table_names": ["wide_table", "deep_table"],
            "refresh_delay": 0,
            "refresh_interval": 0,
            "hit_rate_threshold": 0.9,
            "gpucacheper": 0.1,
            "gpucache": True,
            "cache_refresh_percentage_per_iteration": 0.2,
            "label_dim": 1,
            "slot_num": 28,
            "use_static_table": False,
            "use_context_stream": False,
        },
        {
            "model": "dcn",
            "sparse_files": ["/models/dcn/1/0_sparse_10000.model"],
            "dense_file": "/models/dcn/1/_dense_10000.model",
            "network_file": "/models/dcn/1/dcn.json",
            "deployed_device_list": [1, 0],
            "max_batch_size": 1024,
            "default_value_for_each_table": [0.0],
            "maxnum_catfeature_query_per_table_per_sample": [26],
            "embedding_vecsize_per_table": [16],
            "gpucache": True,
            "gpucacheper": 0.5,
            "hit_rate_threshold": 1.1,
            "embedding_cache_type": "uvm",
        },
    ],
}

# The smallest ps.json HugeCTR v24.06 accepts: only the keys its parser requires.
MINIMAL_PS: dict[str, Any] = {
    "supportlonglong": False,
    "models": [
        {
            "model": "tiny",
            "sparse_files": ["tiny/0_sparse.model"],
            "deployed_device_list": [0],
            "default_value_for_each_table": [0.0],
            "maxnum_catfeature_query_per_table_per_sample": [1],
            "embedding_vecsize_per_table": [8],
        }
    ],
}


def write_ps(folder: Path, obj: Any, name: str = "ps.json") -> Path:
    """Write ``obj`` as JSON to ``folder/name`` and return the file's path."""
    path = folder / name
    path.write_text(json.dumps(obj, indent=2), encoding="utf-8")
    return path


def problems_of(obj: Any, base_dir: Path = Path("/repo")) -> list[Problem]:
    """Parse ``obj``, which must be invalid, and return the problems reported."""
    with pytest.raises(ConfigError) as info:
        parse_ps_config(obj, base_dir)
    assert info.value.problems, "ConfigError without problems"
    return info.value.problems
