"""GPU instances through a real tritonserver: caches in front of the host tier, keys on the GPU.

Two KIND_GPU instances serve a model whose caches hold half of each table and are filled at
start (EC initialisation) and refreshed while serving. Every key's vector over HTTP, gRPC
and CUDA shared memory must equal the file; the metrics endpoint must show cache traffic.
"""

from __future__ import annotations

import importlib.util
import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytest.importorskip("cupy")

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.server.process import TritonServer

ROOT = Path(__file__).resolve().parents[2]
DIMS = (16, 128)
DEFAULTS = (0.5, -2.0)


def _load_client():
    path = ROOT / "client_examples" / "hps_cuda_shm_client.py"
    spec = importlib.util.spec_from_file_location("hps_cuda_shm_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gpu")
    rng = np.random.default_rng(5)
    tables = []
    for t, (rows, dim) in enumerate(((20_000, DIMS[0]), (5_000, DIMS[1]))):
        keys = rng.choice(2**50, rows, replace=False).astype(np.int64) - 2**49
        vectors = rng.standard_normal((rows, dim)).astype(np.float32)
        write_sparse_table(root / f"t{t}", keys, vectors)
        tables.append((keys, vectors))
    ps = {
        "supportlonglong": True,
        "models": [
            {
                "model": "emb",
                "sparse_files": ["t0", "t1"],
                "embedding_vecsize_per_table": list(DIMS),
                "default_value_for_each_table": list(DEFAULTS),
                "maxnum_catfeature_query_per_table_per_sample": [100, 100],
                "max_batch_size": 64,
                "deployed_device_list": [0],
                "gpucache": True,
                "gpucacheper": 0.5,
                "hit_rate_threshold": 0.8,
                "cache_refresh_percentage_per_iteration": 0.2,
                "refresh_delay": 0.0,
                "refresh_interval": 1,
            }
        ],
    }
    (root / "ps.json").write_text(json.dumps(ps))
    args = ["repo", str(root / "ps.json"), str(root / "repo"), "--kind", "KIND_GPU"]
    assert hps_main([*args, "--instances", "2"]) == 0
    with TritonServer(root / "repo", log_file=root / "server.log") as server:
        yield server, tables, root / "server.log"


def _expected(tables, keys_per_table) -> np.ndarray:
    parts = []
    for t, keys in enumerate(keys_per_table):
        index = {int(k): i for i, k in enumerate(tables[t][0])}
        for k in keys.tolist():
            i = index.get(k)
            parts.append(tables[t][1][i] if i is not None else np.full(DIMS[t], DEFAULTS[t]))
    return np.concatenate(parts).astype(np.float32)


def test_every_key_over_http_and_grpc(served) -> None:
    server, tables, log = served
    assert 'EC initialization for model: "emb", num_tables: 2' in log.read_text()
    clients = [
        (httpclient, httpclient.InferenceServerClient(server.http_url.split("//")[-1])),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])),
    ]
    rng = np.random.default_rng(0)
    for module, client in clients:
        for start in range(0, 20_000, 6400):
            k0 = tables[0][0][start : start + 6400]
            k1 = rng.choice(tables[1][0], 500)
            k1[:3] = [1, 2, 3]  # keys the table lacks
            keys = np.concatenate([k0, k1])[None]
            counts = np.array([[len(k0), len(k1)]], np.int32)
            inputs = [
                module.InferInput("KEYS", list(keys.shape), "INT64"),
                module.InferInput("NUMKEYS", [1, 2], "INT32"),
            ]
            inputs[0].set_data_from_numpy(keys)
            inputs[1].set_data_from_numpy(counts)
            got = client.infer("emb", inputs).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(got[0], _expected(tables, [k0, k1]))
        client.close()


def test_keys_through_cuda_shared_memory(served) -> None:
    server, tables, _ = served
    client = _load_client()
    rng = np.random.default_rng(1)
    keys = [rng.choice(tables[0][0], 3000), rng.choice(tables[1][0], 800)]
    got = client.lookup_via_cuda_shm(server.grpc_url.split("//")[-1], "emb", keys, 0)
    want = _expected(tables, keys)
    np.testing.assert_array_equal(np.concatenate([g.ravel() for g in got]), want)


def test_metrics_show_cache_traffic_per_gpu(served) -> None:
    server, tables, _ = served
    client = grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])
    keys = np.concatenate([tables[0][0][:100], tables[1][0][:50]])[None]
    inputs = [
        grpcclient.InferInput("KEYS", list(keys.shape), "INT64"),
        grpcclient.InferInput("NUMKEYS", [1, 2], "INT32"),
    ]
    inputs[0].set_data_from_numpy(keys)
    inputs[1].set_data_from_numpy(np.array([[100, 50]], np.int32))
    for _ in range(2):  # the second lookup hits what the first inserted
        client.infer("emb", inputs)
    client.close()
    # Each instance's thread publishes its counters twice a second, with no further request.
    deadline = time.monotonic() + 10
    while True:
        text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
        hits = [
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("hps_cache_hits_total") and 'device="gpu0"' in line
        ]  # fmt: skip
        if sum(hits) > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sum(hits) > 0, text[-2000:]
    assert "hps_cache_hit_rate" in text and "hps_unknown_keys_total" in text


def test_two_instances_share_one_cache_per_table(served) -> None:
    _, _, log = served
    text = log.read_text()
    shared = [
        line for line in text.splitlines() if "caches shared with the other instances" in line
    ]
    assert sum("built here" in line for line in shared) == 1, text[-3000:]
    assert sum("joined" in line for line in shared) == 1, text[-3000:]
    assert "skipped here" in text  # only the instance that built the caches fills them
