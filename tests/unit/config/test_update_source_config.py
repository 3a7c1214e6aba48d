"""``update_source`` against HugeCTR v24.06: defaults, aliases, the limits its
KafkaMessageSource checks at start, and the broker list librdkafka is given."""

from __future__ import annotations

import pytest

from hps_core.config import parse_ps_config
from hps_core.config.enums import UpdateSourceType
from hps_core.config.parse_tiers import kafka_brokers
from hps_core.config.schema import UpdateSourceConfig
from hps_core.errors import ConfigError
from hps_core.updates.kafka_conf import bootstrap_servers

# HugeCTR's UpdateSourceParams defaults (inference_utils.hpp) and Python binding defaults.
HUGECTR_DEFAULTS = {
    "type": UpdateSourceType.NULL,
    "brokers": "127.0.0.1:9092",
    "metadata_refresh_interval_ms": 30_000,
    "receive_buffer_size": 256 * 1024,
    "poll_timeout_ms": 500,
    "max_batch_size": 8 * 1024,
    "failure_backoff_ms": 50,
    "max_commit_interval": 32,
}


def _source(minimal, section):
    minimal["update_source"] = section
    return parse_ps_config(minimal, "/repo").update_source


def _problems(minimal, section):
    minimal["update_source"] = section
    with pytest.raises(ConfigError) as info:
        parse_ps_config(minimal, "/repo")
    return [(p.where, p.message) for p in info.value.problems]


@pytest.mark.parametrize("section", [None, {}, {"type": "kafka"}])
def test_defaults_are_hugectrs(minimal, section):
    if section is None:
        source = parse_ps_config(minimal, "/repo").update_source
    else:
        source = _source(minimal, section)
    want = dict(HUGECTR_DEFAULTS)
    if section and "type" in section:
        want["type"] = UpdateSourceType.KAFKA_MESSAGE_QUEUE
    assert {k: getattr(source, k) for k in want} == want
    assert {k: getattr(UpdateSourceConfig(), k) for k in want} == HUGECTR_DEFAULTS


def test_every_key_is_read(minimal):
    section = {
        "type": "kafka_message_queue",
        "brokers": "a:1;b:2",
        "metadata_refresh_interval_ms": 10,
        "receive_buffer_size": 1024,
        "poll_timeout_ms": 1,
        "max_batch_size": 1,
        "failure_backoff_ms": 0,
        "max_commit_interval": 1,
    }
    source = _source(minimal, dict(section))
    assert source.to_dict() == section | {"type": "kafka_message_queue"}


@pytest.mark.parametrize(
    ("key", "bad", "fragment"),
    [
        # HCTR_CHECKs of KafkaMessageSource's constructor.
        ("metadata_refresh_interval_ms", 9, ">= 10, found 9"),
        ("receive_buffer_size", 1023, ">= 1024, found 1023"),
        ("poll_timeout_ms", 0, "in [1, 2147483646], found 0"),
        ("poll_timeout_ms", 2**31 - 1, "found 2147483647"),
        ("max_batch_size", 0, ">= 1, found 0"),
        ("max_commit_interval", 0, ">= 1, found 0"),
        ("failure_backoff_ms", -1, ">= 0, found -1"),
        ("brokers", "", "non-empty string"),
        ("brokers", "a:9092;:9093", "has no host"),
        ("brokers", "a:port", "port must be an integer"),
    ],
)
def test_values_hugectr_refuses_at_start_are_problems(minimal, key, bad, fragment):
    problems = _problems(minimal, {"type": "kafka", key: bad})
    assert len(problems) == 1
    where, message = problems[0]
    assert where == f"update_source.{key}" and fragment in message


def test_older_max_receive_buffer_size_is_ignored_not_an_error(minimal):
    source = _source(minimal, {"type": "kafka", "max_receive_buffer_size": 2000})
    assert source.ignored_keys == ("max_receive_buffer_size",)


@pytest.mark.parametrize(
    ("text", "entries"),
    [
        ("127.0.0.1:9092", ["127.0.0.1:9092"]),
        ("10.0.0.5:9092;10.0.0.6:9093", ["10.0.0.5:9092", "10.0.0.6:9093"]),
        ("kafka-a, kafka-b:19092", ["kafka-a:9092", "kafka-b:19092"]),
        ("[::1]:9092;[fe80::2]", ["[::1]:9092", "[fe80::2]:9092"]),
    ],
)
def test_broker_lists_take_hugectrs_semicolons_and_librdkafkas_commas(text, entries):
    assert kafka_brokers(text) == entries
    # librdkafka splits bootstrap.servers at commas only.
    assert bootstrap_servers(text) == ",".join(entries)
