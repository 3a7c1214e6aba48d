"""librdkafka settings shared by the update producer and consumer.

The values are HugeCTR's (``kafka_message.cpp``) where it sets them, so that a deployment
behaves as one running HugeCTR's HPS; each caller may override any of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hps_core.config.parse_tiers import kafka_brokers

# HugeCTR: receive.message.max.bytes = 128 MiB on both ends.
RECEIVE_MESSAGE_MAX_BYTES = 128 * 1024 * 1024


def bootstrap_servers(brokers: str) -> str:
    """ps.json ``brokers`` (``host:port`` separated by ``;`` as HugeCTR documents it, or by
    ``,``) as librdkafka's comma-separated list.

    Raises:
        ValueError: an entry has no host or a bad port.

    Example:
        >>> bootstrap_servers("10.0.0.5:9092;10.0.0.6:9092")
        '10.0.0.5:9092,10.0.0.6:9092'
    """
    return ",".join(kafka_brokers(brokers))


def merged(base: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """``base`` with ``extra`` on top (librdkafka settings, values as librdkafka takes them)."""
    out = dict(base)
    out.update(extra or {})
    return out
