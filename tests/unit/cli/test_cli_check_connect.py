"""``hps check --connect``: the Redis cluster and Kafka brokers a ps.json names are tried,
one that does not answer (or refuses the password) is a problem naming its field; without
``--connect`` the summary says they were not contacted."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_testdata import write_model
from kafka_broker import kafka_broker
from redis_cluster import SECRET, RedisCluster, redis_cluster

from hps_core.cli.main import main
from hps_core.tiers.backing import table_tag
from hps_core.updates.producer import create_topics

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    yield from redis_cluster(password=SECRET)


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    yield from kafka_broker()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_servers(ps: Path, redis: dict[str, object], brokers: str) -> Path:
    doc = json.loads(ps.read_text())
    doc["volatile_db"] = {"type": "redis_cluster", **redis}
    doc["update_source"] = {"type": "kafka_message_queue", "brokers": brokers}
    ps.write_text(json.dumps(doc))
    return ps


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_servers_not_contacted_are_named(tmp_path: Path, capsys) -> None:
    ps, _ = write_model(tmp_path)
    with_servers(ps, {"address": "10.0.0.9:7000"}, "10.0.0.9:9092")
    code, out, _ = check(capsys, str(ps))
    assert code == 0
    assert (
        "servers: not contacted: Redis cluster at 10.0.0.9:7000, Kafka brokers at 10.0.0.9:9092 "
        "(--connect tries them)\n" in out
    )


def test_servers_that_do_not_answer_are_problems(tmp_path: Path, capsys) -> None:
    ps, _ = write_model(tmp_path)
    redis, kafka = f"127.0.0.1:{closed_port()}", f"127.0.0.1:{closed_port()}"
    with_servers(ps, {"address": redis}, kafka)
    code, out, err = check(capsys, str(ps), "--connect")
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert any(
        line.startswith(f"volatile_db.address: '{redis}': cannot open the Redis cluster")
        for line in lines
    ), err
    assert any(
        line.startswith(f"update_source.brokers: no answer from '{kafka}'") for line in lines
    ), err


def test_answering_servers_say_what_they_hold(
    tmp_path: Path, capsys, cluster: RedisCluster, broker: str
) -> None:
    ps, _ = write_model(tmp_path)
    with_servers(ps, {"address": cluster.address, "password": "wrong"}, broker)
    code, _, err = check(capsys, str(ps), "--connect")
    assert code == 1 and "volatile_db.password: the Redis cluster at" in err

    with_servers(ps, {"address": cluster.address, "password": SECRET}, broker)
    create_topics(broker, [table_tag("wdl", "sparse_embedding0")], 1)
    code, out, err = check(capsys, str(ps), "--connect")
    assert code == 0, err
    assert (
        f"servers: Redis cluster at {cluster.address}: 3 primary nodes answer and hold rows "
        "of 0 of 2 tables of the ps.json (servers fill their tables when they first start)\n" in out
    )
    assert (
        f"servers: Kafka brokers at {broker} answer and have the topics of 1 of 2 tables of the "
        "ps.json (servers create their tables' topics when they start)\n" in out
    )
    assert "not contacted" not in out

    code, out, _ = check(capsys, str(ps), "--connect", "--json")
    assert code == 0 and len(json.loads(out)["connections"]) == 2
