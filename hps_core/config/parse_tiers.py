"""The storage-tier sections of ps.json: ``volatile_db``, ``persistent_db``, ``update_source``.

Each reader takes the section's JSON value and returns its config, or ``None`` after
recording the section's problems in the collector. Keys, aliases and defaults are HugeCTR
v24.06's; :mod:`hps_core.config.parse` lists where they differ from HugeCTR's docs.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from hps_core.config.checks import (
    AT_LEAST_0,
    OPEN_UNIT,
    UNIT,
    Bounds,
    Collector,
    ObjectReader,
    dataclass_defaults,
)
from hps_core.config.enums import (
    DATABASE_TYPE_NAMES,
    OVERFLOW_POLICY_NAMES,
    PERSISTENT_DATABASE_TYPES,
    UPDATE_SOURCE_TYPE_NAMES,
    VOLATILE_DATABASE_TYPES,
    DatabaseType,
)
from hps_core.config.schema import PersistentDBConfig, UpdateSourceConfig, VolatileDBConfig

# Keys older HugeCTR releases read in these sections; v24.06 ignores them.
_VOLATILE_IGNORED = (
    "algorithm",
    "max_get_batch_size",
    "max_set_batch_size",
    "refresh_time_after_fetch",
)
_PERSISTENT_IGNORED = ("max_get_batch_size", "max_set_batch_size")
_UPDATE_SOURCE_IGNORED = ("max_receive_buffer_size",)

KAFKA_DEFAULT_PORT = 9092
"""The port of a ``brokers`` entry without one (librdkafka's default)."""

# HugeCTR's KafkaMessageSource checks these when it starts (HCTR_CHECK, a crash at load time
# in HugeCTR); they are checked here whatever the type, as a value that can never work.
_METADATA_REFRESH_BOUNDS = Bounds(low=10)
_RECEIVE_BUFFER_BOUNDS = Bounds(low=1024)
# poll_timeout_ms goes to rd_kafka_consumer_poll as an int: (0, INT_MAX).
_POLL_TIMEOUT_BOUNDS = Bounds(low=1, high=2**31 - 2)


def kafka_brokers(brokers: str) -> list[str]:
    """The entries of an ``update_source.brokers`` list, each ``host:port``.

    HugeCTR documents ``host[:port][;host[:port]...]`` and hands the string to librdkafka,
    which splits at commas; both separators are accepted here. A missing port is 9092.

    Args:
        brokers: the ps.json value.

    Returns:
        ``host:port`` strings (IPv6 hosts in brackets), in the given order.

    Raises:
        ValueError: an entry is empty or its port is not an integer in [1, 65535].

    Example:
        >>> kafka_brokers("10.0.0.5:9092;kafka-b")
        ['10.0.0.5:9092', 'kafka-b:9092']
    """
    out = []
    for entry in (part.strip() for part in re.split(r"[;,]", brokers)):
        host, port_text = entry, ""
        if entry.startswith("["):  # [IPv6]:port
            inner, _, rest = entry[1:].partition("]")
            host, port_text = f"[{inner}]" if inner else "", rest.removeprefix(":")
        elif entry.count(":") == 1:
            host, port_text = entry.split(":")
        if not host:
            raise ValueError(
                f"entry {entry!r} has no host (write host:port, separated by ';' or ',')"
            )
        port = KAFKA_DEFAULT_PORT if not port_text else None
        if port_text.isdigit() and 1 <= int(port_text) <= 65535:
            port = int(port_text)
        if port is None:
            raise ValueError(f"entry {entry!r}: the port must be an integer in [1, 65535]")
        out.append(f"{host}:{port}")
    return out


REDIS_DEFAULT_PORT = 6379
"""The port of an ``address`` entry without one (redis++'s default, which HugeCTR uses)."""


def redis_seeds(address: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` seeds of a Redis ``volatile_db.address``.

    HugeCTR reads ``host[:port]`` entries separated by commas (``[v6]:port`` for IPv6; its
    header documents semicolons, also accepted); a missing port is Redis's 6379. HugeCTR
    connects through the first entry only; every entry is a seed here, so the cluster opens
    while any one of them answers.

    Args:
        address: e.g. ``"10.0.0.1:7000,10.0.0.2:7000"``.

    Returns:
        The seeds in the order given.

    Raises:
        ValueError: an entry is empty or its port is not an integer in [1, 65535].

    Example:
        >>> redis_seeds("127.0.0.1:7000, redis-b")
        [('127.0.0.1', 7000), ('redis-b', 6379)]
    """
    seeds = []
    for entry in (part.strip() for part in address.replace(";", ",").split(",")):
        host, port_text = entry, ""
        if entry.startswith("["):  # [IPv6]:port
            host, _, rest = entry[1:].partition("]")
            port_text = rest.removeprefix(":")
        elif entry.count(":") == 1:
            host, port_text = entry.split(":")
        if not host:
            raise ValueError(f"entry {entry!r} has no host (write host:port, comma-separated)")
        port = REDIS_DEFAULT_PORT if not port_text else None
        if port_text.isdigit() and 1 <= int(port_text) <= 65535:
            port = int(port_text)
        if port is None:
            raise ValueError(f"entry {entry!r}: the port must be an integer in [1, 65535]")
        seeds.append((host, port))
    return seeds


def _section(
    c: Collector,
    value: Any,
    where: str,
    fields: dict[str, Any],
    defaults: dict[str, Any],
    ignored_keys: tuple[str, ...],
    config_type: type,
) -> Any:
    """Read one section: its fields, then the config, or ``None`` if it had problems."""
    obj = c.object(value, where)
    if obj is None:
        return None
    start = len(c.problems)
    r = ObjectReader(c, obj, where)
    values = r.read(fields, defaults)
    ignored = r.finish(ignored_keys)
    if len(c.problems) > start:
        return None
    return config_type(**values, ignored_keys=ignored)


def volatile_defaults(c: Collector) -> dict[str, Any]:
    """Defaults of ``volatile_db``, with the TLS file paths resolved against ``c.base_dir``."""
    defaults = dataclass_defaults(VolatileDBConfig)
    for key in ("tls_ca_certificate", "tls_client_certificate", "tls_client_key"):
        defaults[key] = c.base_dir / defaults[key]
    return defaults


def volatile_db(c: Collector, value: Any, where: str) -> VolatileDBConfig | None:
    """Read the ``volatile_db`` section; a ``redis_cluster`` one must have a valid address."""
    defaults = volatile_defaults(c)
    # HugeCTR: a volatile_db section without "type" is disabled; no section at all is not.
    defaults["type"] = DatabaseType.DISABLED
    config = _section(
        c,
        value,
        where,
        {
            "type": partial(c.choice, names=DATABASE_TYPE_NAMES, allowed=VOLATILE_DATABASE_TYPES),
            "address": partial(c.string, nonempty=True),
            "user_name": c.string,
            "password": c.secret,
            "num_partitions": c.int_in(),
            "allocation_rate": c.int_in(),
            "shared_memory_size": c.int_in(),
            "shared_memory_name": partial(c.string, nonempty=True),
            "shared_memory_auto_remove": c.boolean,
            "num_node_connections": c.int_in(),
            "max_batch_size": c.int_in(),
            "enable_tls": c.boolean,
            "tls_ca_certificate": c.path,
            "tls_client_certificate": c.path,
            "tls_client_key": c.path,
            "tls_server_name_identification": c.string,
            "overflow_margin": c.int_in(),
            "overflow_policy": partial(c.choice, names=OVERFLOW_POLICY_NAMES),
            "overflow_resolution_target": c.number_in(OPEN_UNIT),
            "initialize_after_startup": c.boolean,
            "initial_cache_rate": c.number_in(UNIT),
            "cache_missed_embeddings": c.boolean,
            "update_filters": c.list_of(c.regex),
            "store_compressed": c.boolean,
        },
        defaults,
        _VOLATILE_IGNORED,
        VolatileDBConfig,
    )
    compressed = config is not None and config.store_compressed
    if compressed and config.type is not DatabaseType.REDIS_CLUSTER:
        c.add(
            f"{where}.store_compressed",
            "applies to a redis_cluster only: the host tier (type "
            f"'{config.type.value}') holds every table in its storage_precision already",
        )
        return None
    if config is not None and config.type is DatabaseType.REDIS_CLUSTER:
        # HugeCTR fails on a bad port only when it connects (std::stoi); say so at load.
        try:
            redis_seeds(config.address)
        except ValueError as exc:
            c.add(f"{where}.address", str(exc))
            return None
    return config


def persistent_db(c: Collector, value: Any, where: str) -> PersistentDBConfig | None:
    """Read the ``persistent_db`` section."""
    config = _section(
        c,
        value,
        where,
        {
            "type": partial(c.choice, names=DATABASE_TYPE_NAMES, allowed=PERSISTENT_DATABASE_TYPES),
            "path": c.path,
            "num_threads": c.int_in(),
            "read_only": c.boolean,
            "max_batch_size": c.int_in(),
            "initialize_after_startup": c.boolean,
            "update_filters": c.list_of(c.regex),
            "store_compressed": c.boolean,
        },
        dataclass_defaults(PersistentDBConfig),
        _PERSISTENT_IGNORED,
        PersistentDBConfig,
    )
    if config is not None and config.store_compressed and config.type is DatabaseType.DISABLED:
        c.add(f"{where}.store_compressed", "applies to a rocks_db only: persistent_db is disabled")
        return None
    return config


def update_source(c: Collector, value: Any, where: str) -> UpdateSourceConfig | None:
    """Read the ``update_source`` section; its brokers must be ``host[:port]`` entries."""
    config = _section(
        c,
        value,
        where,
        {
            "type": partial(c.choice, names=UPDATE_SOURCE_TYPE_NAMES),
            "brokers": partial(c.string, nonempty=True),
            "metadata_refresh_interval_ms": c.int_in(_METADATA_REFRESH_BOUNDS),
            "receive_buffer_size": c.int_in(_RECEIVE_BUFFER_BOUNDS),
            "poll_timeout_ms": c.int_in(_POLL_TIMEOUT_BOUNDS),
            "max_batch_size": c.int_in(),
            "failure_backoff_ms": c.int_in(AT_LEAST_0),
            "max_commit_interval": c.int_in(),
        },
        dataclass_defaults(UpdateSourceConfig),
        _UPDATE_SOURCE_IGNORED,
        UpdateSourceConfig,
    )
    if config is not None:
        # HugeCTR fails on a bad broker only when the consumer connects; say so at load.
        try:
            kafka_brokers(config.brokers)
        except ValueError as exc:
            c.add(f"{where}.brokers", str(exc))
            return None
    return config
