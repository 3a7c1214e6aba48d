"""The `hps` contract served by a real tritonserver: values, defaults, errors, batching.

One server (two CPU instances) is started for the module from a repository that
``hps repo`` writes for a ps.json with two tables, negative and extreme keys included.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.server.process import TritonServer, process_group_members
from hps_core.tiers.host_table import host_layout

pytestmark = pytest.mark.integration

MODEL = "emb"
DIMS = (8, 24)
DEFAULTS = (0.25, -1.0)
MAX_BATCH = 4
MAX_QUERY = (10, 5)  # per sample: 40 and 20 keys per request at most


def _make_tables(root: Path, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    tables = []
    for t, (rows, dim) in enumerate(((3000, DIMS[0]), (700, DIMS[1]))):
        keys = rng.choice(np.arange(-(10**12), 10**12, 7919), rows - 2, replace=False)
        keys = np.concatenate([keys, [np.iinfo(np.int64).min, np.iinfo(np.int64).max]])
        keys = rng.permutation(keys).astype(np.int64)
        vectors = rng.standard_normal((rows, dim)).astype(np.float32)
        write_sparse_table(root / f"t{t}", keys, vectors)
        tables.append((keys, vectors))
    return tables


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, module_triton_server):
    root = tmp_path_factory.mktemp("emb")
    tables = _make_tables(root / "data", np.random.default_rng(7))
    ps = {
        "supportlonglong": True,
        "models": [
            {
                "model": MODEL,
                "sparse_files": ["data/t0", "data/t1"],
                "embedding_vecsize_per_table": list(DIMS),
                "default_value_for_each_table": list(DEFAULTS),
                "maxnum_catfeature_query_per_table_per_sample": list(MAX_QUERY),
                "max_batch_size": MAX_BATCH,
                "deployed_device_list": [0],
            }
        ],
    }
    (root / "ps.json").write_text(json.dumps(ps))
    repo = root / "repo"
    assert hps_main(["repo", str(root / "ps.json"), str(repo), "--instances", "2"]) == 0
    yield module_triton_server(repo), tables


def _clients(server: TritonServer):
    return [
        (httpclient, httpclient.InferenceServerClient(server.http_url.split("//")[-1])),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])),
    ]


def _infer(module, client, keys: np.ndarray, numkeys: np.ndarray) -> np.ndarray:
    inputs = [
        module.InferInput("KEYS", list(keys.shape), "INT64"),
        module.InferInput("NUMKEYS", list(numkeys.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(keys)
    inputs[1].set_data_from_numpy(numkeys)
    return client.infer(MODEL, inputs).as_numpy("OUTPUT0")


def _expected(tables, keys_per_table) -> np.ndarray:
    parts = []
    for t, keys in enumerate(keys_per_table):
        file_keys, vectors = tables[t]
        index = {int(k): i for i, k in enumerate(file_keys)}
        for k in keys:
            i = index.get(int(k))
            parts.append(vectors[i] if i is not None else np.full(DIMS[t], DEFAULTS[t], np.float32))
    return np.concatenate(parts)


def test_every_key_equals_the_file_over_http_and_grpc(served) -> None:
    server, tables = served
    max_keys = [MAX_BATCH * q for q in MAX_QUERY]
    for module, client in _clients(server):
        # Walk both tables to the end in requests of the largest allowed size.
        n0, n1 = len(tables[0][0]), len(tables[1][0])
        for start in range(0, max(-(-n0 // max_keys[0]), -(-n1 // max_keys[1]))):
            k0 = tables[0][0][start * max_keys[0] : (start + 1) * max_keys[0]]
            k1 = tables[1][0][start * max_keys[1] : (start + 1) * max_keys[1]]
            keys = np.concatenate([k0, k1])[None, :]
            numkeys = np.array([[len(k0), len(k1)]], dtype=np.int32)
            got = _infer(module, client, keys, numkeys)
            want = _expected(tables, [k0, k1])
            assert got.shape == (1, len(want))
            np.testing.assert_array_equal(got[0], want)


def test_unknown_keys_get_the_table_default(served) -> None:
    server, tables = served
    rng = np.random.default_rng(3)
    known0 = rng.choice(tables[0][0], 5)
    unknown = np.array([1, 2, 3, -(10**15)], dtype=np.int64)  # not multiples of 7919 offsets
    assert not np.isin(unknown, tables[0][0]).any() and not np.isin(unknown, tables[1][0]).any()
    k0 = np.concatenate([known0, unknown])
    k1 = unknown[:2]
    for module, client in _clients(server):
        got = _infer(module, client, np.concatenate([k0, k1])[None], np.array([[9, 2]], np.int32))
        want = _expected(tables, [k0, k1])
        np.testing.assert_array_equal(got[0], want)
        defaults = got[0][5 * DIMS[0] : 9 * DIMS[0]]
        assert (defaults == DEFAULTS[0]).all()


BAD_REQUESTS = [
    # (keys, numkeys, words the message must contain)
    (np.array([[1, 2, 3]]), np.array([[2, 2]]), ["NUMKEYS", "sum to 4", "3 keys"]),
    (np.array([[1, 2, 3]]), np.array([[4, -1]]), ["NUMKEYS", "negative"]),
    (np.array([[1, 2, 3]]), np.array([[3]]), ["NUMKEYS", "expected 2 counts"]),
    (np.arange(41)[None], np.array([[41, 0]]), ["NUMKEYS", "table 0", "41 keys", "40 allowed"]),
    (np.zeros((1, 0)), np.array([[0, 0]]), ["KEYS", "empty"]),
]


@pytest.mark.parametrize("keys,numkeys,words", BAD_REQUESTS)
def test_bad_request_fails_alone_with_invalid_arg(served, keys, numkeys, words) -> None:
    server, tables = served
    stubs_before = _stub_pids(server)
    for module, client in _clients(server):
        with pytest.raises(InferenceServerException) as info:
            _infer(module, client, keys.astype(np.int64), numkeys.astype(np.int32))
        message = str(info.value)
        assert all(w in message for w in words), message
        status = str(info.value.status())
        assert status in ("400", "StatusCode.INVALID_ARGUMENT"), status
    # The server still serves, from the same stub processes.
    module, client = _clients(server)[0]
    got = _infer(module, client, tables[0][0][:1][None], np.array([[1, 0]], np.int32))
    np.testing.assert_array_equal(got[0], tables[0][1][0])
    assert _stub_pids(server) == stubs_before


def test_wrong_dtype_is_rejected_by_name(served) -> None:
    server, _ = served
    for module, client in _clients(server):
        inputs = [
            module.InferInput("KEYS", [1, 2], "INT32"),
            module.InferInput("NUMKEYS", [1, 2], "INT32"),
        ]
        inputs[0].set_data_from_numpy(np.array([[1, 2]], np.int32))
        inputs[1].set_data_from_numpy(np.array([[1, 1]], np.int32))
        with pytest.raises(InferenceServerException) as info:
            client.infer(MODEL, inputs)
        assert "KEYS" in str(info.value) and "INT32" in str(info.value)


def test_bad_and_good_requests_in_one_batch(served) -> None:
    """Concurrent requests share executes (dynamic batcher); only the bad ones fail."""
    server, tables = served
    rng = np.random.default_rng(11)
    url = server.http_url.split("//")[-1]
    client = httpclient.InferenceServerClient(url, concurrency=16)

    def one(i: int):
        k0 = rng.choice(tables[0][0], 3)
        k1 = rng.choice(tables[1][0], 2)
        counts = [3, 2] if i % 3 else [3, 3]  # every third request is malformed
        inputs = [
            httpclient.InferInput("KEYS", [1, 5], "INT64"),
            httpclient.InferInput("NUMKEYS", [1, 2], "INT32"),
        ]
        inputs[0].set_data_from_numpy(np.concatenate([k0, k1])[None])
        inputs[1].set_data_from_numpy(np.array([counts], np.int32))
        return i, k0, k1, client.async_infer(MODEL, inputs)

    pending = [one(i) for i in range(48)]
    for i, k0, k1, request in pending:
        if i % 3:
            got = request.get_result().as_numpy("OUTPUT0")
            np.testing.assert_array_equal(got[0], _expected(tables, [k0, k1]))
        else:
            with pytest.raises(InferenceServerException, match="NUMKEYS"):
                request.get_result()
    client.close()


def test_concurrent_clients_get_their_own_answers(served) -> None:
    server, tables = served
    url = server.grpc_url.split("//")[-1]

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        client = grpcclient.InferenceServerClient(url)
        for _ in range(10):
            n0, n1 = int(rng.integers(1, 40)), int(rng.integers(0, 20))
            k0, k1 = rng.choice(tables[0][0], n0), rng.choice(tables[1][0], n1)
            got = _infer(
                grpcclient, client, np.concatenate([k0, k1])[None], np.array([[n0, n1]], np.int32)
            )
            np.testing.assert_array_equal(got[0], _expected(tables, [k0, k1]))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, range(8)))


def _stub_pids(server: TritonServer) -> set[int]:
    pids = set()
    for pid in process_group_members(server.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"triton_python_backend_stub" in cmdline:
            pids.add(pid)
    return pids


def test_two_instances_share_one_host_tier_copy(served) -> None:
    server, tables = served
    stubs = _stub_pids(server)
    assert len(stubs) == 2, stubs
    mapped: dict[int, set[str]] = {}
    for pid in stubs:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        mapped[pid] = {line.split()[-1] for line in maps if "hps-triton." in line}
    first, second = mapped.values()
    # Both stubs map the same two segments (one per table), and no other copy exists.
    assert len(first) == 2 and first == second, mapped
    for path in first:
        assert Path(path).exists()
        size = Path(path).stat().st_size
        table_bytes = [k.nbytes + v.nbytes for k, v in tables]
        assert any(size <= 1.3 * b for b in table_bytes), (size, table_bytes)


def _lookup_counts(server: TritonServer) -> tuple[float, float, float, str]:
    """``hps_lookups_total``, ``hps_lookup_keys_total`` and ``hps_unknown_keys_total`` of
    table 0 (all instances), once two readings a second apart agree (counters are published
    twice a second), and the page."""
    names = ("hps_lookups_total", "hps_lookup_keys_total", "hps_unknown_keys_total")
    last, deadline = None, time.monotonic() + 30
    while True:
        text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
        now = tuple(_metric(text, name, 'table="sparse_embedding0"') for name in names)
        if now == last or time.monotonic() > deadline:
            return (*now, text)
        last = now
        time.sleep(1.0)


def test_metrics_endpoint_counts_lookups_per_table(served) -> None:
    """Keys and unknown keys are counted per occurrence: an unknown key asked twice in a
    request counts twice (the module's other tests looked keys up before: differences)."""
    server, tables = served
    module, client = _clients(server)[0]
    keys = np.concatenate([tables[0][0][:3], [1, 1, 2]])[None]  # 1 and 2 are unknown keys
    known = set(tables[0][0].tolist())
    assert not {1, 2} & known
    lookups0, keys0, unknown0, _ = _lookup_counts(server)
    for _ in range(3):
        _infer(module, client, keys, np.array([[6, 0]], np.int32))
    lookups, looked_up, unknown, text = _lookup_counts(server)
    assert lookups - lookups0 == 3, text[-3000:]
    assert looked_up - keys0 == 3 * keys.size
    assert unknown - unknown0 == 3 * sum(k not in known for k in keys.ravel().tolist()) == 9
    assert 'device="cpu"' in text


def _metric(text: str, name: str, label: str) -> float:
    # Summed over instances: each instance publishes its own series.
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )


def test_metrics_endpoint_reports_tier_bytes(served) -> None:
    """``hps_tier_bytes``, set at load: one series per table for the host tier (both CPU
    instances set the same one), the size of its shared-memory segment; no GPU tier."""
    server, tables = served
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    series = [line for line in text.splitlines() if line.startswith("hps_tier_bytes{")]
    assert len(series) == len(tables), series
    for t, (keys, vectors) in enumerate(tables):
        (line,) = [s for s in series if f'table="sparse_embedding{t}"' in s]
        for label in (f'model="{MODEL}"', 'tier="host"', 'precision="fp32"', 'device="host"'):
            assert label in line, line
        expected = host_layout(len(keys), vectors.shape[1]).nbytes
        assert float(line.rsplit(" ", 1)[1]) == expected
    segments = set()
    for pid in _stub_pids(server):
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        segments |= {line.split()[-1] for line in maps if "hps-triton." in line}
    assert sorted(Path(p).stat().st_size for p in segments) == sorted(
        host_layout(len(k), v.shape[1]).nbytes for k, v in tables
    )
