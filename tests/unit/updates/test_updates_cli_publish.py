"""``hps publish`` end to end: a sparse folder, a Parquet file and the changed keys between
two folders reach a consumer of the table's topic exactly."""

from __future__ import annotations

import re
import socket

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from updates_testlib import Collector, make_consumer, poll_until, rows

from hps_core.cli.main import main
from hps_core.formats.sparse_writer import SparseTableWriter
from hps_core.updates import topic_for
from hps_core.updates.producer import create_topics

pytestmark = pytest.mark.timeout(120)


def write_sparse(folder, keys, vectors):
    with SparseTableWriter(folder) as writer:
        writer.append(keys, vectors)


def test_hps_publish_sparse_parquet_and_changed(broker, model, tmp_path, capsys):
    tag = topic_for(model, "emb")
    keys, vectors = rows(3000, 16, seed=11)
    write_sparse(tmp_path / "v1", keys, vectors)
    base = ["publish", "--brokers", broker, "--model", model, "--table", "emb"]

    # No server has made the table's topic yet: refused unless asked for.
    assert main([*base, "--sparse", str(tmp_path / "v1")]) == 2
    err = capsys.readouterr().err
    assert f"topic '{tag}' does not exist at {broker}" in err and "--create-topic" in err
    assert (
        main([*base, "--sparse", str(tmp_path / "v1"), "--linger-ms", "5", "--create-topic"]) == 0
    )
    out = capsys.readouterr().out
    assert re.search(rf"sent 3000 keys in \d+ messages to {re.escape(tag)} .* keys/s\)", out)

    # Parquet rows: other keys, a list<double> column as pandas would write it.
    p_keys, p_vectors = rows(500, 16, seed=12, start=10_000)
    table = pa.table({"id": p_keys, "emb": pa.array(p_vectors.astype(np.float64).tolist())})
    pq.write_table(table, tmp_path / "rows.parquet")
    args = ["--parquet", str(tmp_path / "rows.parquet"), "--key-column", "id"]
    assert main([*base, *args, "--vector-column", "emb"]) == 0
    assert "sent 500 keys" in capsys.readouterr().out

    # Version 2 of the table: 7 vectors changed, one key added.
    v2_vectors = vectors.copy()
    v2_vectors[100:107] *= -1
    v2_keys = np.append(keys, 99)
    v2_vectors = np.vstack([v2_vectors, np.full((1, 16), 0.5, np.float32)])
    write_sparse(tmp_path / "v2", v2_keys, v2_vectors)
    assert main([*base, "--changed", str(tmp_path / "v1"), str(tmp_path / "v2")]) == 0
    out = capsys.readouterr().out
    assert "sent 8 keys" in out and "1 added, 7 changed, 2993 unchanged" in out

    target = Collector()
    consumer = make_consumer(broker, [tag], target, group_id=f"{model}.g")
    try:
        poll_until(consumer, lambda: target.keys_applied() == 3000 + 500 + 8)
    finally:
        consumer.stop()
    want = dict(zip(v2_keys.tolist(), v2_vectors, strict=True))
    want.update(zip(p_keys.tolist(), p_vectors, strict=True))
    got = target.rows[tag]
    assert got.keys() == want.keys()
    assert all(np.array_equal(got[k], v) for k, v in want.items())


def test_hps_publish_reports_bad_arguments_in_one_line(tmp_path, capsys):
    base = ["publish", "--model", "m", "--table", "t", "--sparse", str(tmp_path)]
    code = main([*base, "--brokers", "kafka:99999"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "port must be an integer" in err
    bad_model = ["publish", "--brokers", "k:9092", "--model", "a.b", "--table", "t"]
    assert main([*bad_model, "--sparse", str(tmp_path)]) == 2
    assert "contain no '.'" in capsys.readouterr().err


def test_hps_publish_refuses_a_topic_no_server_made_and_names_the_model_s_tables(
    broker, model, tmp_path, capsys
):
    create_topics(broker, [topic_for(model, "sparse_embedding0"), topic_for(model, "dense")], 1)
    keys, vectors = rows(10, 4, seed=3)
    write_sparse(tmp_path / "v1", keys, vectors)
    base = ["publish", "--brokers", broker, "--sparse", str(tmp_path / "v1")]

    assert main([*base, "--model", model, "--table", "sparse_embeding0"]) == 2
    err = capsys.readouterr().err
    assert f"the tables of model '{model}' there: dense, sparse_embedding0" in err
    assert 'did you mean --table "sparse_embedding0"?' in err

    assert main([*base, "--model", model + "x", "--table", "sparse_embedding0"]) == 2
    err = capsys.readouterr().err
    assert f"no table of model '{model}x' has a topic there" in err
    assert f'did you mean --model "{model}"?' in err

    assert main([*base, "--model", model, "--table", "sparse_embedding0"]) == 0
    assert "sent 10 keys" in capsys.readouterr().out


@pytest.mark.parametrize("create_topic", [False, True])
def test_hps_publish_to_unreachable_brokers_exits_2_saying_nothing_was_published(
    tmp_path, capfd, create_topic
):
    """No broker listens: one line on stderr after the metadata wait, none of librdkafka's
    (which would reach file descriptor 2 directly)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        brokers = f"127.0.0.1:{s.getsockname()[1]}"  # closed once the test runs
    keys, vectors = rows(10, 4, seed=3)
    write_sparse(tmp_path / "v1", keys, vectors)
    args = ["publish", "--brokers", brokers, "--model", "m", "--table", "t"]
    args += ["--sparse", str(tmp_path / "v1")] + (["--create-topic"] if create_topic else [])

    assert main(args) == 2
    out, err = capfd.readouterr()
    assert out == ""
    assert re.fullmatch(
        rf"error: the Kafka brokers {re.escape(brokers)} did not answer within 10 s \(.+\); "
        r"nothing was published to hps_et\.m\.t\n",
        err,
    ), err
