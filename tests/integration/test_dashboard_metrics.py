"""Every metric the Grafana dashboard (docs/grafana/hps-triton.json) reads exists on a live
tritonserver's ``/metrics``, with the labels its matchers use.

One server holds the default repository (``hps prepare``: the ``hps`` lookup model and the
ranking models) and one model with a Kafka ``update_source`` (a tansu broker), whose update
metrics only such a model publishes. After a few lookups, a bad request and a request to every
model, the test reads ``/metrics`` and parses every panel's PromQL expression and every
variable query: each metric name must be a family there (a histogram's ``_bucket``, ``_sum``
and ``_count`` count as its family), and each label a selector matches on must be one of the
family's labels."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from grafana_dashboard import expressions, family_of, load_dashboard, parse_exposition, selectors
from kafka_broker import FAST_GROUP_OPTIONS, kafka_broker

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer.model_io import KAFKA_OPTIONS_PARAMETER
from hps_core.triton_repo import read_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

UPDATED = "dashboard_updates"
DIM = 8


@pytest.fixture(scope="module")
def broker():
    yield from kafka_broker()


def _repository(root: Path, broker: str) -> Path:
    """The default repository plus one lookup model taking online updates over Kafka."""
    repo = root / "repo"
    assert hps_main(["prepare", str(repo)]) == 0
    keys = np.arange(1, 201, dtype=np.int64)
    write_sparse_table(root / "data" / "t0", keys, np.ones((len(keys), DIM), np.float32))
    ps = {
        "supportlonglong": True,
        "update_source": {"type": "kafka_message_queue", "brokers": broker,
                          "poll_timeout_ms": 50, "failure_backoff_ms": 20},
        "models": [{
            "model": UPDATED,
            "sparse_files": [str(root / "data" / "t0")],
            "embedding_table_names": ["dashboard_t0"],
            "embedding_vecsize_per_table": [DIM],
            "default_value_for_each_table": [0.0],
            "maxnum_catfeature_query_per_table_per_sample": [16],
            "max_batch_size": 1,
            "deployed_device_list": [0],
        }],
    }  # fmt: skip
    (root / "ps.json").write_text(json.dumps(ps))
    updates_repo = root / "updates_repo"
    command = ["repo", str(root / "ps.json"), str(updates_repo), "--instances", "1"]
    assert hps_main(command) == 0
    config_path = updates_repo / UPDATED / "config.pbtxt"
    config = read_config(config_path)
    config.parameters[KAFKA_OPTIONS_PARAMETER].string_value = json.dumps(FAST_GROUP_OPTIONS)
    write_config(config_path, config)
    shutil.move(str(updates_repo / UPDATED), str(repo / UPDATED))
    return repo


def _lookup(client: httpclient.InferenceServerClient, model: str, keys: list[list[int]]) -> None:
    flat = np.array([k for table in keys for k in table], np.int64)[None]
    inputs = [
        httpclient.InferInput("KEYS", list(flat.shape), "INT64"),
        httpclient.InferInput("NUMKEYS", [1, len(keys)], "INT32"),
    ]
    inputs[0].set_data_from_numpy(flat)
    inputs[1].set_data_from_numpy(np.array([[len(t) for t in keys]], np.int32))
    client.infer(model, inputs)


def _missing(text: str, dashboard: dict) -> list[str]:
    """What the dashboard reads that ``text`` (a /metrics page) lacks."""
    families = parse_exposition(text)
    problems = []
    for where, expr in expressions(dashboard):
        for name, labels in selectors(expr):
            family = family_of(name, families)
            if family is None:
                problems.append(f"{where}: no metric {name}")
            elif not labels <= families[family]:
                problems.append(
                    f"{where}: {name} has no label {sorted(labels - families[family])} "
                    f"(it has {sorted(families[family])})"
                )
    return problems


def test_every_panel_reads_metrics_the_server_publishes(
    broker: str, tmp_path: Path, triton_server
) -> None:
    dashboard = load_dashboard()
    server = triton_server(_repository(tmp_path, broker), startup_timeout_s=240)
    client = httpclient.InferenceServerClient(server.http_url.split("//")[-1])
    try:  # an open connection would hold the server's stop for its exit timeout
        for i in range(5):
            _lookup(client, "hps_embedding", [[i, 99_999, 7], [i + 1, 19_999]])
            _lookup(client, UPDATED, [[i + 1, 500]])
        with pytest.raises(Exception, match=r"NUMKEYS|KEYS"):  # a bad request: counted failed
            _lookup(client, "hps_embedding", [[1, 2, 3]])
    finally:
        client.close()
    # Counters reach the endpoint twice a second; a Kafka model's update metrics once its
    # consumer started.
    deadline = time.monotonic() + 60
    while True:
        text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
        problems = _missing(text, dashboard)
        failed = re.search(
            r'^hps_requests_failed_total\{[^}]*model="hps_embedding"[^}]*'
            r'reason="invalid_argument"[^}]*\} [1-9]',
            text,
            re.MULTILINE,
        )
        if (not problems and failed) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not problems, "\n".join(problems)
    assert failed, "the bad request is not counted in hps_requests_failed_total"
