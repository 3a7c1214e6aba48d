"""Enumerated ps.json values and the spellings HugeCTR v24.06 accepts for each.

Each enum's value is HugeCTR's canonical name (what ``hctr_enum_to_c_str`` prints and what
``to_dict`` writes back). The alias tables map every spelling HugeCTR's parser accepts to its
member; matching is exact and case-sensitive, as in HugeCTR.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum


class DatabaseType(str, Enum):
    """Backend of the volatile (host memory / Redis) or persistent (RocksDB) tier."""

    DISABLED = "disabled"
    HASH_MAP = "hash_map"
    PARALLEL_HASH_MAP = "parallel_hash_map"
    MULTI_PROCESS_HASH_MAP = "multi_process_hash_map"
    REDIS_CLUSTER = "redis_cluster"
    ROCKS_DB = "rocks_db"


class OverflowPolicy(str, Enum):
    """Which embeddings a full volatile-database partition evicts first."""

    EVICT_RANDOM = "evict_random"
    EVICT_LEAST_USED = "evict_least_used"
    EVICT_OLDEST = "evict_oldest"


class UpdateSourceType(str, Enum):
    """Where online embedding updates come from."""

    NULL = "null"
    KAFKA_MESSAGE_QUEUE = "kafka_message_queue"


class EmbeddingCacheType(str, Enum):
    """Kind of GPU embedding cache of a model."""

    DYNAMIC = "dynamic"
    STATIC = "static"
    UVM = "uvm"
    STOCHASTIC = "stochastic"


DATABASE_TYPE_NAMES: Mapping[str, DatabaseType] = {
    "disabled": DatabaseType.DISABLED,
    "disable": DatabaseType.DISABLED,
    "none": DatabaseType.DISABLED,
    "hash_map": DatabaseType.HASH_MAP,
    "hashmap": DatabaseType.HASH_MAP,
    "hash": DatabaseType.HASH_MAP,
    "map": DatabaseType.HASH_MAP,
    "parallel_hash_map": DatabaseType.PARALLEL_HASH_MAP,
    "parallel_hashmap": DatabaseType.PARALLEL_HASH_MAP,
    "parallel_hash": DatabaseType.PARALLEL_HASH_MAP,
    "parallel_map": DatabaseType.PARALLEL_HASH_MAP,
    "multi_process_hash_map": DatabaseType.MULTI_PROCESS_HASH_MAP,
    "multi_process_hashmap": DatabaseType.MULTI_PROCESS_HASH_MAP,
    "multi_process_hash": DatabaseType.MULTI_PROCESS_HASH_MAP,
    "multi_process_map": DatabaseType.MULTI_PROCESS_HASH_MAP,
    "redis_cluster": DatabaseType.REDIS_CLUSTER,
    "redis": DatabaseType.REDIS_CLUSTER,
    "rocks_db": DatabaseType.ROCKS_DB,
    "rocksdb": DatabaseType.ROCKS_DB,
    "rocks": DatabaseType.ROCKS_DB,
}

VOLATILE_DATABASE_TYPES = frozenset(
    {
        DatabaseType.DISABLED,
        DatabaseType.HASH_MAP,
        DatabaseType.PARALLEL_HASH_MAP,
        DatabaseType.MULTI_PROCESS_HASH_MAP,
        DatabaseType.REDIS_CLUSTER,
    }
)
PERSISTENT_DATABASE_TYPES = frozenset({DatabaseType.DISABLED, DatabaseType.ROCKS_DB})

OVERFLOW_POLICY_NAMES: Mapping[str, OverflowPolicy] = {
    "evict_random": OverflowPolicy.EVICT_RANDOM,
    "random": OverflowPolicy.EVICT_RANDOM,
    "evict_least_used": OverflowPolicy.EVICT_LEAST_USED,
    "least_used": OverflowPolicy.EVICT_LEAST_USED,
    "evict_oldest": OverflowPolicy.EVICT_OLDEST,
    "oldest": OverflowPolicy.EVICT_OLDEST,
}

UPDATE_SOURCE_TYPE_NAMES: Mapping[str, UpdateSourceType] = {
    "null": UpdateSourceType.NULL,
    "none": UpdateSourceType.NULL,
    "kafka_message_queue": UpdateSourceType.KAFKA_MESSAGE_QUEUE,
    "kafka_mq": UpdateSourceType.KAFKA_MESSAGE_QUEUE,
    "kafka": UpdateSourceType.KAFKA_MESSAGE_QUEUE,
}

EMBEDDING_CACHE_TYPE_NAMES: Mapping[str, EmbeddingCacheType] = {
    member.value: member for member in EmbeddingCacheType
}
