"""Kafka updates reach a user's PyTorch model served by a real tritonserver: its LookupLayer
looks up through the instance's served lookup, whose update consumer applies what
``hps publish --changed`` sends (changed rows and new keys); within a bound both instances
answer the published rows through the module, as the embedding models do."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from kafka_broker import FAST_GROUP_OPTIONS, kafka_broker

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer.model_io import KAFKA_OPTIONS_PARAMETER
from hps_core.triton_repo import read_config, write_config

pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL, TABLE = "torch_updated", "t_items"
DIM, ROWS, KEYS = 16, 500, 8
DEFAULT = -0.5
VISIBLE_WITHIN_S = 30.0
MODULE = f'''
import torch
from hps_core import hps_torch


class Rows(torch.nn.Module):
    """A sample's {KEYS} keys' rows, scaled by a weight (a dense part to load)."""

    def __init__(self, ps, model):
        super().__init__()
        self.rows = hps_torch.LookupLayer(ps, model, 0, {DIM})
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, keys):
        return self.rows(keys) * self.scale


def build(ps_config_file, model_name):
    return Rows(ps_config_file, model_name)
'''


@pytest.fixture(scope="module")
def broker():
    yield from kafka_broker()


def _served_folder(root: Path, brokers: str) -> tuple[Path, dict[int, np.ndarray]]:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((ROWS, DIM), dtype=np.float32)
    write_sparse_table(root / "v1", np.arange(ROWS, dtype=np.int64), rows)
    ps = {
        "supportlonglong": True,
        "update_source": {"type": "kafka_message_queue", "brokers": brokers,
                          "poll_timeout_ms": 50, "failure_backoff_ms": 20},
        "models": [{
            "model": MODEL, "sparse_files": [str(root / "v1")], "embedding_table_names": [TABLE],
            "embedding_vecsize_per_table": [DIM], "default_value_for_each_table": [DEFAULT],
            "maxnum_catfeature_query_per_table_per_sample": [KEYS], "max_batch_size": 16,
            "deployed_device_list": [0],
        }],
    }  # fmt: skip
    (root / "ps.json").write_text(json.dumps(ps))
    (root / "rows.py").write_text(MODULE)
    import torch

    torch.save({"scale": torch.full((1,), 2.0)}, root / "dense.pt")
    module, weights = f"{root / 'rows.py'}:build", str(root / "dense.pt")
    assert hps_main(["repo-torch", str(root / "ps.json"), str(root / "repo"), "--model", MODEL,
                     "--module", module, "--state-dict", weights,
                     "--input", f"keys:int64:{KEYS}", "--output", f"rows:fp32:{KEYS}x{DIM}",
                     "--instances", "2"]) == 0  # fmt: skip
    # tansu assigns a group's partitions after half the session timeout: keep it short.
    path = root / "repo" / MODEL / "config.pbtxt"
    config = read_config(path)
    config.parameters[KAFKA_OPTIONS_PARAMETER].string_value = json.dumps(FAST_GROUP_OPTIONS)
    write_config(path, config)
    return root / "repo", {k: rows[k] for k in range(ROWS)}


def _answers(client, reference: dict[int, np.ndarray], keys: np.ndarray) -> bool:
    tensor = httpclient.InferInput("keys", list(keys.shape), "INT64")
    tensor.set_data_from_numpy(keys)
    got = client.infer(MODEL, [tensor]).as_numpy("rows")
    want = np.stack([[reference.get(int(k), np.full(DIM, DEFAULT, np.float32)) for k in sample]
                     for sample in keys]) * 2.0  # fmt: skip
    return bool(np.array_equal(got, want))


def test_published_updates_reach_the_modules_lookups(
    broker: str, triton_server, tmp_path: Path
) -> None:
    repo, reference = _served_folder(tmp_path, broker)
    server = triton_server(repo, startup_timeout_s=180)
    client = httpclient.InferenceServerClient(server.http_url.split("//")[-1])
    try:
        # Rows 100-199 changed, 50 keys new (beyond the files), the rest as they were.
        keys = np.arange(80, 80 + 16 * KEYS, dtype=np.int64).reshape(16, KEYS)
        keys[-1] = np.arange(ROWS + 10, ROWS + 10 + KEYS)
        assert _answers(client, reference, keys)  # before: the files' rows, defaults beyond
        rng = np.random.default_rng(1)
        updated = dict(reference)
        for k in range(100, 200):
            updated[k] = rng.standard_normal(DIM, dtype=np.float32)
        for k in range(ROWS, ROWS + 50):
            updated[k] = rng.standard_normal(DIM, dtype=np.float32)
        new_keys = np.array(sorted(updated), dtype=np.int64)
        write_sparse_table(tmp_path / "v2", new_keys, np.stack([updated[k] for k in new_keys]))
        changed = ["--changed", str(tmp_path / "v1"), str(tmp_path / "v2")]
        args = ["publish", "--brokers", broker, "--model", MODEL, "--table", TABLE,
                "--linger-ms", "5", *changed]  # fmt: skip
        assert hps_main(args) == 0
        start = time.monotonic()
        # Every instance (requests land on either) answers the published rows.
        while not all(_answers(client, updated, keys) for _ in range(6)):
            if time.monotonic() - start > VISIBLE_WITHIN_S:
                pytest.fail("the served module did not answer the published rows in time")
            time.sleep(0.1)
    finally:
        client.close()
