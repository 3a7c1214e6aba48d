"""``volatile_db.address`` of a ``redis_cluster``: HugeCTR's comma-separated ``host[:port]``
seeds, checked when the ps.json is loaded rather than when the cluster is first reached."""

from __future__ import annotations

from typing import Any

import pytest

from hps_core.config import DatabaseType, parse_ps_config
from hps_core.config.parse_tiers import redis_seeds
from hps_core.errors import ConfigError


@pytest.mark.parametrize(
    ("address", "seeds"),
    [
        ("127.0.0.1:7000", [("127.0.0.1", 7000)]),
        ("a:7000,b:7001, c:7002", [("a", 7000), ("b", 7001), ("c", 7002)]),
        ("redis-host", [("redis-host", 6379)]),  # no port: Redis's default, as redis++
        ("a:7000;b:7001", [("a", 7000), ("b", 7001)]),  # semicolons, as HugeCTR's header
        ("[::1]:7000,[fe80::1]", [("::1", 7000), ("fe80::1", 6379)]),
    ],
)
def test_seeds_of_an_address(address: str, seeds: list[tuple[str, int]]) -> None:
    assert redis_seeds(address) == seeds


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:70000", "port must be an integer in [1, 65535]"),
        ("127.0.0.1:x", "port must be an integer in [1, 65535]"),
        ("a:7000,,b:7000", "has no host"),
        (":7000", "has no host"),
    ],
)
def test_bad_redis_addresses_are_problems_at_load(
    minimal: dict[str, Any], address: str, message: str
) -> None:
    minimal["volatile_db"] = {"type": "redis_cluster", "address": address}
    with pytest.raises(
        ConfigError, match=r"volatile_db\.address: .*" + message.replace("[", r"\[")
    ):
        parse_ps_config(minimal, "/repo")


def test_address_is_only_checked_for_redis(minimal: dict[str, Any]) -> None:
    """Other volatile types never connect anywhere: HugeCTR ignores their address."""
    minimal["volatile_db"] = {"type": "hash_map", "address": "not:a:port"}
    assert parse_ps_config(minimal, "/repo").volatile_db.type is DatabaseType.HASH_MAP


def test_redis_section_reads_hugectrs_keys(minimal: dict[str, Any]) -> None:
    minimal["volatile_db"] = {
        "type": "redis",
        "address": "10.0.0.1:7000,10.0.0.2:7000",
        "user_name": "hps",
        "password": "pw",
        "num_partitions": 8,
        "num_node_connections": 3,
        "max_batch_size": 1000,
        "overflow_margin": 100,
        "overflow_policy": "oldest",
        "overflow_resolution_target": 0.5,
        "refresh_time_after_fetch": True,  # read by older HugeCTR releases: ignored
    }
    vdb = parse_ps_config(minimal, "/repo").volatile_db
    assert vdb.type is DatabaseType.REDIS_CLUSTER
    assert (vdb.num_partitions, vdb.num_node_connections, vdb.max_batch_size) == (8, 3, 1000)
    assert (vdb.overflow_margin, vdb.overflow_resolution_target) == (100, 0.5)
    assert vdb.ignored_keys == ("refresh_time_after_fetch",)
    assert "pw" not in repr(vdb)
