"""A Kafka outage while a real tritonserver serves under load (issue 47, item 2).

One ps.json, two models of two CPU instances each: ``emb`` takes online updates, ``plain``
takes none (the databases' ``update_filters`` match only ``emb``'s topic), so it must start
no Kafka consumer. A tansu broker whose storage outlives it (an S3 bucket) is killed for
about 15 s and started again on its port while client threads keep asking both models and
check every answered row against the sparse files and the rows published (0 wrong). During
the outage ``hps publish`` exits 2 in one line saying nothing was published; an update
published before the outage is served throughout, one published after the return is served
by every instance; rows published to ``plain``'s topic are never served. Rows a running producer
published during the outage are delivered when the broker returns and served: nothing is
lost. The server's log holds one line per instance when the broker goes and one when it is
back, nothing of librdkafka's own; ``/metrics`` counts the outage and says when the broker is
unreachable.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from kafka_broker import FAST_GROUP_OPTIONS, TansuBroker, persistent_kafka_broker
from private_shm import private_shm_dir

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer.model_io import KAFKA_OPTIONS_PARAMETER
from hps_core.triton_repo import read_config, write_config
from hps_core.updates import UpdateProducer, topic_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

INSTANCES = 2
QUERY = 64
OUTAGE_S = 15.0
WITHIN_S = 60.0
# name -> (rows, dim, default value); keys of one model never collide with the other's
MODELS = {"emb": (2000, 16, -0.25), "plain": (1000, 8, 0.5)}


@pytest.fixture
def broker():
    yield from persistent_kafka_broker()


class Table:
    """One model's table and every version of it a client may be answered.

    Args:
        root: where its sparse folders are written.
        name: the model's name (its one table is ``t0``).
        seed: of its keys and vectors.
    """

    def __init__(self, root: Path, name: str, seed: int) -> None:
        rows, self.dim, self.default = MODELS[name]
        rng = np.random.default_rng(seed)
        self.name = name
        self.folder = root / name / "v0"
        keys = rng.choice(np.arange(1, 10**12, 7919 + seed), rows, replace=False)
        vectors = rng.standard_normal((rows, self.dim)).astype(np.float32)
        write_sparse_table(self.folder, keys, vectors)
        # Asked: the file's keys and as many it lacks (new keys of the updates among them).
        self.keys = np.concatenate([keys, keys[: rows // 2] + 1]).astype(np.int64)
        self.held = np.arange(len(self.keys)) < rows  # keys the newest version holds
        v0 = np.full((len(self.keys), self.dim), self.default, np.float32)
        v0[:rows] = vectors
        self.versions = [v0]

    def update(self, root: Path, rows: slice, seed: int) -> Path:
        """A new version: the rows of ``self.keys[rows]`` (file keys and new ones) changed.

        Returns:
            Its sparse folder (every key it holds), for ``hps publish --changed``.
        """
        rng = np.random.default_rng(seed)
        new = self.versions[-1].copy()
        new[rows] = rng.standard_normal(new[rows].shape).astype(np.float32)
        self.versions.append(new)
        self.held[rows] = True
        folder = root / self.name / f"v{len(self.versions) - 1}"
        write_sparse_table(folder, self.keys[self.held], new[self.held])
        return folder

    def wrong(self, picked: np.ndarray, got: np.ndarray) -> int:
        """Rows of ``got`` (answers for ``self.keys[picked]``) equal to no version."""
        ok = np.zeros(len(picked), bool)
        for version in self.versions:
            ok |= np.all(got == version[picked], axis=1)
        return int((~ok).sum())


def _infer(client: httpclient.InferenceServerClient, table: Table, keys: np.ndarray):
    inputs = [
        httpclient.InferInput("KEYS", [1, len(keys)], "INT64"),
        httpclient.InferInput("NUMKEYS", [1, 1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(keys[None])
    inputs[1].set_data_from_numpy(np.array([[len(keys)]], np.int32))
    answer = client.infer(table.name, inputs).as_numpy("OUTPUT0")
    return answer.reshape(len(keys), table.dim)


class Load:
    """Client threads asking one model without pause, checking every row they get.

    Args:
        url: the server's HTTP ``host:port``.
        table: the model's table and versions.
        threads: how many clients.
    """

    def __init__(self, url: str, table: Table, threads: int = 2) -> None:
        self.table = table
        self.answers: list[float] = []  # when each answer came
        self.wrong = 0
        self.errors: list[str] = []
        self._url = url
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(seed,), daemon=True) for seed in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, seed: int) -> None:
        client = httpclient.InferenceServerClient(self._url)
        rng = np.random.default_rng(seed)
        while not self._stop.is_set():
            picked = rng.choice(len(self.table.keys), QUERY, replace=False)
            try:
                got = _infer(client, self.table, self.table.keys[picked])
            except Exception as exc:  # kept and failed on: a request must never fail here
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            wrong = self.table.wrong(picked, got)
            with self._lock:
                self.answers.append(time.monotonic())
                self.wrong += wrong

    def stop(self) -> None:
        """Stop the threads and wait for them."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def answered_between(self, start: float, end: float) -> int:
        """Answers that came between two moments."""
        with self._lock:
            return sum(start <= t <= end for t in self.answers)


def _repository(root: Path, brokers: str, tables: dict[str, Table]) -> Path:
    ps = {
        "supportlonglong": True,
        # HugeCTR's volatile database takes the updates of the topics these match: emb's.
        "volatile_db": {"type": "hash_map", "update_filters": ["^hps_et\\.emb\\..+$"]},
        "update_source": {
            "type": "kafka_message_queue",
            "brokers": brokers,
            "poll_timeout_ms": 50,
            "failure_backoff_ms": 20,
        },
        "models": [
            {
                "model": name,
                "sparse_files": [str(table.folder)],
                "embedding_table_names": ["t0"],
                "embedding_vecsize_per_table": [table.dim],
                "default_value_for_each_table": [table.default],
                "maxnum_catfeature_query_per_table_per_sample": [QUERY],
                "max_batch_size": 1,
                "deployed_device_list": [0],
            }
            for name, table in tables.items()
        ],
    }
    (root / "ps.json").write_text(json.dumps(ps))
    repo = root / "repo"
    command = ["repo", str(root / "ps.json"), str(repo), "--instances", str(INSTANCES)]
    assert hps_main([*command, "--kind", "KIND_CPU"]) == 0
    # tansu assigns a group's partitions after half the session timeout: keep it short.
    for path in repo.glob("*/config.pbtxt"):
        config = read_config(path)
        config.parameters[KAFKA_OPTIONS_PARAMETER].string_value = json.dumps(FAST_GROUP_OPTIONS)
        write_config(path, config)
    return repo


def _metrics(server, name: str, model: str) -> dict[str, float]:
    """Values of one metric of one model, by instance."""
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            instance = re.search(r'instance="([^"]+)"', line)
            found[instance.group(1) if instance else ""] = float(line.rsplit(" ", 1)[1])
    return found


def _wait(what: str, done, timeout_s: float = WITHIN_S, server=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}{_state(server)}")
        time.sleep(0.2)


def _state(server) -> str:
    """What a failed wait shows: the update metrics of every instance and the server log's
    Kafka and update lines (the server's own log is not in a CI report)."""
    if server is None:
        return ""
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    metrics = [line for line in text.splitlines() if line.startswith("hps_update_")]
    log = Path(server.log_file).read_text(errors="replace").splitlines()
    lines = [line for line in log if "kafka" in line.lower() or "update" in line.lower()]
    return "\n" + "\n".join(["metrics:", *metrics, "log:", *lines[-60:]])


def _applied(server, keys: int):
    """A test of whether every emb instance says it applied at least ``keys`` rows."""

    def done() -> bool:
        counts = _metrics(server, "hps_update_keys_total", "emb")
        return len(counts) == INSTANCES and min(counts.values()) >= keys

    return done


def _reachable(server, value: float):
    """A test of whether every emb instance's reachability gauge is ``value``."""

    def done() -> bool:
        gauges = _metrics(server, "hps_update_source_reachable", "emb")
        return len(gauges) == INSTANCES and set(gauges.values()) == {value}

    return done


def _publish(broker: TansuBroker, table: Table, old: Path, new: Path, *extra: str) -> None:
    args = ["publish", "--brokers", broker.address, "--model", table.name, "--table", "t0"]
    assert hps_main([*args, "--linger-ms", "5", *extra, "--changed", str(old), str(new)]) == 0


def test_a_broker_outage_under_load_logs_two_lines_per_instance_and_loses_nothing(
    broker: TansuBroker, triton_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private_shm_dir(tmp_path, monkeypatch)  # the server's host-tier segments
    tables = {name: Table(tmp_path / "data", name, seed) for seed, name in enumerate(MODELS)}
    emb, plain = tables["emb"], tables["plain"]
    server = triton_server(_repository(tmp_path, broker.address, tables), startup_timeout_s=180)
    url = server.http_url.split("//")[-1]
    loads = [Load(url, emb), Load(url, plain)]
    try:
        # Before the outage: 300 changed rows and 200 new keys, served by every instance.
        v1 = emb.update(tmp_path / "data", slice(1700, 2200), seed=11)
        _publish(broker, emb, emb.folder, v1)
        _wait("update 1 applied by every emb instance", _applied(server, 500), server=server)
        before = max(_metrics(server, "hps_update_keys_total", "emb").values())
        # A training job's producer, running through the outage (it knows the topic).
        producer = UpdateProducer(broker.address, linger_ms=5)
        producer.partitions(topic_for("emb", "t0"))

        broker.stop(crash=True)
        down = time.monotonic()
        _wait("the outage on /metrics", _reachable(server, 0.0), server=server)
        # Update 2, published during the outage: queued by librdkafka until the return.
        v2 = emb.update(tmp_path / "data", slice(100, 400), seed=12)
        producer.publish("emb", "t0", emb.keys[100:400], emb.versions[-1][100:400])
        publish = subprocess.run(
            [sys.executable, "-m", "hps_core.cli.main", "publish", "--brokers", broker.address,
             "--model", "emb", "--table", "t0", "--changed", str(emb.folder), str(v1)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert publish.returncode == 2 and publish.stdout == ""
        assert re.fullmatch(
            rf"error: the Kafka brokers {re.escape(broker.address)} did not answer within "
            r"10 s \(.+\); nothing was published to hps_et\.emb\.t0\n",
            publish.stderr,
        ), publish.stderr
        time.sleep(max(0.0, down + OUTAGE_S - time.monotonic()))
        broker.start()
        back = time.monotonic()
        _wait("the broker's return on /metrics", _reachable(server, 1.0), server=server)
        producer.close(timeout_s=60)  # delivered now, nothing lost
        assert producer.messages_delivered == producer.messages_sent > 0

        # Update 3, after the return: rows changed again (some of update 1's), new keys.
        v3 = emb.update(tmp_path / "data", slice(1900, 2600), seed=13)
        _publish(broker, emb, v2, v3)
        _wait(
            "updates 2 and 3 applied by every emb instance",
            _applied(server, before + 1000),
            server=server,
        )
        # Rows for plain's topic, which no instance follows: never to be served.
        fake = plain.update(tmp_path / "data", slice(0, 300), seed=14)
        plain.versions.pop()
        _publish(broker, plain, plain.folder, fake, "--create-topic")
        time.sleep(2.0)  # load goes on after the update and plain's rows
    finally:
        for load in loads:
            load.stop()

    for load in loads:
        assert load.errors == [], load.errors[:3]
        assert load.wrong == 0, f"{load.table.name}: {load.wrong} wrong rows"
        assert load.answered_between(down, back) > 0  # the load went on during the outage
    # Every instance serves the latest rows now, plain its files.
    client = httpclient.InferenceServerClient(url)
    for table, want in ((emb, emb.versions[-1]), (plain, plain.versions[0])):
        for _ in range(3 * INSTANCES):
            for start in range(0, len(table.keys), QUERY):
                rows = slice(start, start + QUERY)
                np.testing.assert_array_equal(_infer(client, table, table.keys[rows]), want[rows])

    outages = _metrics(server, "hps_update_source_outages_total", "emb")
    assert len(outages) == INSTANCES and set(outages.values()) == {1.0}, outages
    metrics = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    plain_updates = [
        line
        for line in metrics.splitlines()
        if line.startswith("hps_update_") and 'model="plain"' in line
    ]
    assert plain_updates == []  # no consumer, no update metrics

    log = Path(server.log_file).read_text()
    assert "rdkafka" not in log and not re.search(r"%\d\|", log), log[-3000:]
    kafka = [line for line in log.splitlines() if "kafka" in line.lower()]
    assert sum("model plain: no Kafka consumer" in line for line in kafka) == INSTANCES, kafka
    at_load = ("no Kafka consumer", "applying online updates", "replaying")
    outage = [line for line in kafka if not any(words in line for words in at_load)]
    prefix = f"hps WARNING kafka: brokers {broker.address} unreachable ("
    assert sorted(line.startswith(prefix) for line in outage) == [False, False, True, True]
    prefix = f"hps INFO kafka: brokers {broker.address} reachable again after "
    assert sum(line.startswith(prefix) for line in outage) == INSTANCES, outage
