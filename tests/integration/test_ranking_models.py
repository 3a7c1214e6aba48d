"""Ranking models served by a real tritonserver: the demo DLRM, DCN and W&D through both
contracts, HTTP and gRPC, against PyTorch (DLRM) and the float64 reference (DCN, W&D); bad
requests fail alone; the dynamic batcher joins requests; perf_analyzer's ``-b`` works.

One server (one CPU instance per model) serves the module from a repository the demo writers
fill, the same functions ``hps prepare`` runs for the default repository.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hps_core.demo import DEMO_MODELS
from hps_core.demo.dlrm import dlrm_state
from hps_core.offline import InferenceModel
from hps_core.server.install import TritonInstallError, find_perf_analyzer
from hps_core.server.perf import run_perf_analyzer
from hps_core.triton_repo import InstanceGroup, ServingOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "infer"))
from ranking_reference import (
    encode_hugectr,
    encode_samples,
    model_tables,
    predict_reference,
    random_keys,
    torch_dlrm_predict,
)

pytestmark = pytest.mark.integration

MODELS = ("dlrm", "dcn", "wdl")
MAX_HOT = {"dlrm": 1, "dcn": 2, "wdl": (1, 2)}  # keys per slot, per table
INVALID = ("400", "StatusCode.INVALID_ARGUMENT")


class Model:
    """A served demo model and its expected predictions."""

    def __init__(self, repo: Path, name: str) -> None:
        self.name = name
        self.ps_json = repo / name / "ps.json"
        self.config, self.tables = model_tables(repo / name / "ps.json", name)
        self.known = [np.array(sorted(t), dtype=np.int64) for t in self.tables]
        self.slot_nums = [26] if name == "dcn" else [2, 26] if name == "wdl" else [1] * 26
        self.state = dlrm_state() if name == "dlrm" else None

    def samples(self, rng: np.random.Generator, batch: int, one_hot: bool = False):
        """Random dense features and keys (multi-hot, empty and unknown keys unless DLRM,
        whose PyTorch reference indexes rows)."""
        multi = not one_hot and self.name != "dlrm"
        keys = random_keys(
            rng, batch, self.slot_nums, self.known, 1 if one_hot else MAX_HOT[self.name],
            empty=0.1 if multi else 0.0, unknown=0.1 if self.name != "dlrm" else 0.0,
        )  # fmt: skip
        return rng.random((batch, 13), dtype=np.float32), keys

    def expected(self, dense: np.ndarray, keys) -> np.ndarray:
        if self.state is not None:
            return torch_dlrm_predict(self.state, dense, keys)
        defaults = list(self.config.default_value_for_each_table)
        return predict_reference(
            self.config.network_file, self.config.dense_file, self.tables, defaults, dense, keys
        )

    def check(self, got: np.ndarray, dense: np.ndarray, keys) -> None:
        want = self.expected(dense, keys).reshape(got.shape)
        # 1e-5 relative; the absolute floor covers float32 rounding near 0 (float64 reference).
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def served(module_triton_server, tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("ranking_repo")
    # A long queue delay makes the dynamic batcher's joining of requests observable.
    options = ServingOptions(max_queue_delay_us=5000, instances=(InstanceGroup(count=1),))
    for name in MODELS:
        DEMO_MODELS[name](repo, options)
    server = module_triton_server(repo, startup_timeout_s=180)
    return server, {name: Model(repo, name) for name in MODELS}


def clients(server):
    return [
        (httpclient, httpclient.InferenceServerClient(server.http_url.split("//")[-1])),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])),
    ]


def infer(module, client, model: str, arrays, names, output: str) -> np.ndarray:
    types = {np.float32: "FP32", np.int32: "INT32", np.int64: "INT64"}
    inputs = []
    for name, array in zip(names, arrays, strict=True):
        tensor = module.InferInput(name, list(array.shape), types[array.dtype.type])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs).as_numpy(output)


def infer_hugectr(module, client, model: str, des, cat, row) -> np.ndarray:
    return infer(
        module, client, model, (des, cat, row), ("DES", "CATCOLUMN", "ROWINDEX"), "OUTPUT0"
    )


def infer_samples(module, client, model: str, dense, sparse) -> np.ndarray:
    return infer(module, client, f"{model}_samples", (dense, sparse), ("dense", "sparse"), "score")


@pytest.mark.parametrize("name", MODELS)
def test_hugectr_contract_predicts_the_reference(served, name: str) -> None:
    server, models = served
    model = models[name]
    rng = np.random.default_rng(1)
    for module, client in clients(server):
        for batch in (1, 7, 256):
            dense, keys = model.samples(rng, batch)
            got = infer_hugectr(module, client, name, *encode_hugectr(dense, keys))
            assert got.shape == (1, batch) and got.dtype == np.float32
            model.check(got, dense, keys)


@pytest.mark.parametrize("name", MODELS)
def test_offline_predictions_equal_the_served_ones(served, name: str) -> None:
    """The offline API (hps_core.offline) on the same files and requests answers as the
    server does, and as PyTorch for the exported DLRM."""
    server, models = served
    model = models[name]
    offline = InferenceModel.from_ps_json(model.ps_json, name)
    rng = np.random.default_rng(21)
    module, client = clients(server)[0]
    for batch in (1, 33):
        dense, keys = model.samples(rng, batch)
        request = encode_hugectr(dense, keys)
        served_scores = infer_hugectr(module, client, name, *request).reshape(batch, -1)
        got = offline.predict(*request)
        np.testing.assert_allclose(got, served_scores, rtol=1e-6, atol=1e-7)
        model.check(got, dense, keys)


@pytest.mark.parametrize("name", MODELS)
def test_samples_contract_predicts_the_reference(served, name: str) -> None:
    server, models = served
    model = models[name]
    rng = np.random.default_rng(2)
    for module, client in clients(server):
        for batch in (1, 5, 256):
            dense, keys = model.samples(rng, batch, one_hot=True)
            got = infer_samples(module, client, name, *encode_samples(dense, keys))
            assert got.shape == (batch, 1) and got.dtype == np.float32
            model.check(got, dense, keys)


def wdl_request():
    """A valid W&D request of two samples (tables of 2 and 26 slots)."""
    keys = [[[[k] for k in (1, 2)], [[7 + s] for s in range(26)]] for _ in range(2)]
    return encode_hugectr(np.ones((2, 13), np.float32), keys)


def replaced(request, index: int, array):
    return tuple(array if i == index else a for i, a in enumerate(request))


def rows_with(request, position: int, value: int):
    rows = request[2].copy()
    rows[0, position] = value
    return rows


BAD_HUGECTR = [
    # (which input to replace, with what, words the message must contain)
    (2, lambda r: r[2][:, :-1], ["ROWINDEX", "28 x batch + 2"]),
    (2, lambda r: np.zeros((1, 2), np.int32), ["ROWINDEX", "at least one sample"]),
    (2, lambda r: np.zeros((1, 257 * 28 + 2), np.int32), ["ROWINDEX", "257 samples"]),
    (0, lambda r: r[0][:, :-1], ["DES", "25"]),
    (2, lambda r: rows_with(r, 5, 1), ["ROWINDEX", "table 1", "must start at 0"]),
    (2, lambda r: rows_with(r, 1, 3), ["ROWINDEX", "table 0", "must not decrease"]),
    (1, lambda r: r[1][:, :-1], ["CATCOLUMN", "holds 55 keys"]),
]


@pytest.mark.parametrize("index,make,words", BAD_HUGECTR)
def test_bad_hugectr_request_fails_with_invalid_arg(served, index, make, words) -> None:
    server, _ = served
    good = wdl_request()
    for module, client in clients(server):
        with pytest.raises(InferenceServerException) as info:
            infer_hugectr(module, client, "wdl", *replaced(good, index, make(good)))
        assert all(w in str(info.value) for w in words), str(info.value)
        assert str(info.value.status()) in INVALID
        got = infer_hugectr(module, client, "wdl", *good)  # and the model keeps serving
        assert got.shape == (1, 2)


def test_bad_samples_request_fails_with_invalid_arg(served) -> None:
    server, _ = served
    # Triton itself checks these against config.pbtxt and names the input.
    cases = [
        ((np.zeros((2, 12), np.float32), np.zeros((2, 28), np.int64)), "dense"),
        ((np.zeros((2, 13), np.float32), np.zeros((2, 27), np.int64)), "sparse"),
        ((np.zeros((3, 13), np.float32), np.zeros((2, 28), np.int64)), "batch size"),
        ((np.zeros((257, 13), np.float32), np.zeros((257, 28), np.int64)), "batch"),
    ]
    for module, client in clients(server):
        for arrays, word in cases:
            with pytest.raises(InferenceServerException) as info:
                infer_samples(module, client, "wdl", *arrays)
            assert word in str(info.value), str(info.value)
            assert str(info.value.status()) in INVALID


def test_bad_and_good_requests_in_one_batch(served) -> None:
    """Concurrent requests share executes (dynamic batcher); only the bad ones fail."""
    server, models = served
    model = models["dcn"]
    rng = np.random.default_rng(3)
    client = httpclient.InferenceServerClient(server.http_url.split("//")[-1], concurrency=16)
    pending = []
    for i in range(48):
        dense, keys = model.samples(rng, int(rng.integers(1, 5)))
        des, cat, row = encode_hugectr(dense, keys)
        if i % 3 == 0:  # every third request is malformed
            row = row.copy()
            row[0, -1] += 1
        inputs = [
            httpclient.InferInput("DES", list(des.shape), "FP32"),
            httpclient.InferInput("CATCOLUMN", list(cat.shape), "INT64"),
            httpclient.InferInput("ROWINDEX", list(row.shape), "INT32"),
        ]
        for tensor, array in zip(inputs, (des, cat, row), strict=True):
            tensor.set_data_from_numpy(array)
        pending.append((i, dense, keys, client.async_infer("dcn", inputs)))
    for i, dense, keys, request in pending:
        if i % 3:
            model.check(request.get_result().as_numpy("OUTPUT0"), dense, keys)
        else:
            with pytest.raises(InferenceServerException, match="CATCOLUMN"):
                request.get_result()
    client.close()


def test_dynamic_batcher_joins_sample_requests(served) -> None:
    server, models = served
    model = models["wdl"]
    rng = np.random.default_rng(4)
    url = server.grpc_url.split("//")[-1]
    before = _counts(url, "wdl_samples")
    requests = [model.samples(rng, int(rng.integers(1, 9)), one_hot=True) for _ in range(40)]

    def one(dense_keys):
        dense, keys = dense_keys
        client = grpcclient.InferenceServerClient(url)
        return infer_samples(grpcclient, client, "wdl", *encode_samples(dense, keys))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, requests))
    for (dense, keys), got in zip(requests, answers, strict=True):
        model.check(got, dense, keys)
    inferences, executions = np.subtract(_counts(url, "wdl_samples"), before)
    assert inferences == sum(len(keys) for _, keys in requests)
    assert executions < len(requests), "the dynamic batcher never joined two requests"


def _counts(url: str, model: str) -> tuple[int, int]:
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics(model, as_json=True)
    [entry] = stats["model_stats"]
    return int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0))


def test_perf_analyzer_batches_samples(served, tmp_path: Path) -> None:
    server, models = served
    try:
        find_perf_analyzer()
    except TritonInstallError as exc:
        pytest.skip(f"perf_analyzer not installed: {exc}")
    dense, keys = models["dlrm"].samples(np.random.default_rng(5), 16, one_hot=True)
    dense, sparse = encode_samples(dense, keys)
    entries = [
        {
            "dense": {"content": d.tolist(), "shape": [13]},
            "sparse": {"content": s.tolist(), "shape": [26]},
        }
        for d, s in zip(dense, sparse, strict=True)
    ]
    data = tmp_path / "samples.json"
    data.write_text(json.dumps({"data": entries}))
    url = server.grpc_url.split("//")[-1]
    before = _counts(url, "dlrm_samples")
    results, output = run_perf_analyzer(
        "dlrm_samples", url, "grpc", data, concurrency=[2],
        measurement_ms=500, stability_percent=999, max_trials=3,
        batch_size=8,
        extra_args=["--measurement-mode", "count_windows", "--measurement-request-count", "30"],
    )  # fmt: skip
    assert results[0].throughput > 0
    assert "error" not in output.lower(), output
    inferences, executions = np.subtract(_counts(url, "dlrm_samples"), before)
    assert inferences >= 8 * executions > 0  # every request carried 8 samples


def test_served_responses_leave_no_traceback_in_the_server_log(served) -> None:
    # NumPy 2's DLPack capsule destructor printed one traceback per response unless the
    # output tensor's consumed capsule carries DLPack's name (triton_backend/tensors.py).
    server, models = served
    rng = np.random.default_rng(8)
    for module, client in clients(server):
        dense, keys = models["dlrm"].samples(rng, 3, one_hot=True)
        infer_samples(module, client, "dlrm", *encode_samples(dense, keys))
        infer_hugectr(module, client, "dlrm", *encode_hugectr(dense, keys))
    log = server.log_path.read_text()
    assert "Traceback" not in log and "PyCapsule" not in log, log[-2000:]
