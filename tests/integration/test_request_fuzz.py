"""Fuzzed requests through a real tritonserver: every request gets a result or a clear error,
the server stays ready, and good requests sent in between stay correct.

Hypothesis draws requests for the DCN demo model (26 multi-hot slots, 13 dense features,
``max_batch_size`` 256) through both ranking contracts (``hugectr``: DES, CATCOLUMN, ROWINDEX;
``_samples``: dense, sparse) over HTTP and gRPC, starting from a valid request and applying one
fault: a wrong dtype, a dropped, added or reshaped tensor, an empty tensor, more samples than
``max_batch_size``, NaN/Inf dense features, finite dense features that overflow float32 in
the network (refused, never answered NaN), negative, zero and extreme keys (int64's minimum is
the caches' empty-slot marker), ROWINDEX offsets that decrease, leave their range or overflow
int32, or a missing or unknown input. A request whose fault leaves it valid (extreme keys) must
be answered with the float64 reference's scores; any other must fail with an error message (a
NaN or infinite feature named by its sample and feature); after each one a known-good request
must still be answered correctly.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from hps_core.demo import DEMO_MODELS
from hps_core.triton_repo import InstanceGroup, ServingOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from instance_kinds import INSTANCE_KINDS
from ranking_reference import encode_hugectr, encode_samples
from test_ranking_models import Model

pytestmark = pytest.mark.integration

NAME = "dcn"
SLOTS, DENSE, MAX_BATCH = 26, 13, 256
EXAMPLES = 500  # per protocol: with the good request after each, 2,000 requests in all

WRONG_DTYPES = {
    np.float32: (np.float64, np.int32, np.float16),
    np.int64: (np.int32, np.float32, np.uint64),
    np.int32: (np.int64, np.float32, np.uint32),
}
KEY_EXTREMES = (0, -1, 1, -(2**63), 2**63 - 1, 2**31, -(2**31) - 1)
VALID_FAULTS = ("none", "extreme_keys", "negative_keys")
FAULTS = (
    *VALID_FAULTS,
    "nan_dense",
    "inf_dense",
    "huge_dense",
    "dtype",
    "drop_last",
    "add_dim",
    "flatten",
    "empty",
    "missing",
    "extra",
    "too_many_samples",
    "rows_decrease",
    "rows_out_of_range",
    "rows_overflow",
)


@pytest.fixture(scope="module", params=INSTANCE_KINDS)
def served(module_triton_server, tmp_path_factory: pytest.TempPathFactory, request):
    repo = tmp_path_factory.mktemp("fuzz_repo")
    DEMO_MODELS[NAME](repo, ServingOptions(instances=(InstanceGroup(count=1, kind=request.param),)))
    server = module_triton_server(repo, startup_timeout_s=180)
    clients = {
        "http": (httpclient, httpclient.InferenceServerClient(server.http_url.split("//")[-1])),
        "grpc": (grpcclient, grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])),
    }
    return server, Model(repo, NAME), clients


def send(module, client, model: str, tensors: dict[str, np.ndarray], output: str):
    inputs = []
    for name, array in tensors.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs).as_numpy(output)


@st.composite
def fuzzed(draw):
    """``(contract, fault, batch seed, fault seed)``."""
    contract = draw(st.sampled_from(("hugectr", "samples")))
    fault = draw(st.sampled_from(FAULTS))
    batch = draw(st.integers(1, 6))
    return contract, fault, batch, draw(st.integers(0, 2**32 - 1))


def build(model: Model, contract: str, fault: str, batch: int, seed: int):
    """The request's tensors, its model and output names, and (when the fault leaves it valid)
    the samples it carries."""
    rng = np.random.default_rng(seed)
    if fault == "too_many_samples":
        batch = MAX_BATCH + 1 + int(rng.integers(0, 64))
    one_hot = contract == "samples"
    dense, keys = model.samples(rng, batch, one_hot=one_hot)
    if fault in ("nan_dense", "inf_dense"):
        bad = np.nan if fault == "nan_dense" else float(rng.choice([np.inf, -np.inf]))
        dense[rng.integers(0, batch), rng.integers(0, DENSE)] = bad
    if fault == "huge_dense":  # finite, but past what float32 holds once multiplied
        dense[rng.integers(0, batch)] = 3e38
    if fault in ("extreme_keys", "negative_keys"):
        for sample in keys:
            for slot in sample[0]:
                for i in range(len(slot)):
                    if rng.random() < 0.3:
                        slot[i] = (
                            int(rng.choice(KEY_EXTREMES))
                            if fault == "extreme_keys"
                            else -int(rng.integers(1, 2**40))
                        )
    if contract == "hugectr":
        des, cat, row = encode_hugectr(dense, keys)
        tensors = {"DES": des, "CATCOLUMN": cat, "ROWINDEX": row}
        model_name, output = NAME, "OUTPUT0"
    else:
        dense_t, sparse = encode_samples(dense, keys)
        tensors = {"dense": dense_t, "sparse": sparse}
        model_name, output = f"{NAME}_samples", "score"
    names = list(tensors)
    pick = names[int(rng.integers(0, len(names)))]
    if fault == "dtype":
        other = WRONG_DTYPES[tensors[pick].dtype.type]
        tensors[pick] = tensors[pick].astype(other[int(rng.integers(0, len(other)))])
    elif fault == "drop_last":
        tensors[pick] = tensors[pick][..., :-1]
    elif fault == "add_dim":
        tensors[pick] = tensors[pick][None]
    elif fault == "flatten":
        tensors[pick] = tensors[pick].reshape(-1)
    elif fault == "empty":
        tensors[pick] = tensors[pick][..., :0]
    elif fault == "missing":
        del tensors[pick]
    elif fault == "extra":
        tensors["EXTRA"] = np.zeros((1, 3) if contract == "hugectr" else (batch, 3), np.float32)
    elif fault.startswith("rows_"):
        if contract == "samples":  # no offsets here: an out-of-range slot count instead
            tensors["sparse"] = np.concatenate([tensors["sparse"]] * 2, axis=1)
        else:
            row = tensors["ROWINDEX"].copy()
            at = 1 + int(rng.integers(0, row.shape[1] - 1))
            if fault == "rows_decrease":
                row[0, at] = row[0, at - 1] - 1 - int(rng.integers(0, 3))
            elif fault == "rows_out_of_range":
                row[0, at] = int(rng.choice([-5, tensors["CATCOLUMN"].shape[1] + 7]))
            else:
                row[0, at] = 2**31 - 1
            tensors["ROWINDEX"] = row
    valid = fault in VALID_FAULTS
    return tensors, model_name, output, (dense, keys) if valid else None


def check_good_request(model: Model, module, client, rng: np.random.Generator) -> None:
    dense, keys = model.samples(rng, 3)
    des, cat, row = encode_hugectr(dense, keys)
    got = send(module, client, NAME, {"DES": des, "CATCOLUMN": cat, "ROWINDEX": row}, "OUTPUT0")
    model.check(got.reshape(-1, 1), dense, keys)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fuzzed_requests_get_an_answer_or_a_clear_error(served, protocol: str) -> None:
    server, model, clients = served
    module, client = clients[protocol]
    rng = np.random.default_rng(99)
    outcomes: Counter[tuple[str, str, str]] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(fuzzed())
    def one(case) -> None:
        contract, fault, batch, seed = case
        tensors, model_name, output, samples = build(model, contract, fault, batch, seed)
        try:
            got = send(module, client, model_name, tensors, output)
        except InferenceServerException as exc:
            assert samples is None, f"a valid request ({fault}) was refused: {exc}"
            assert len(str(exc)) > 10, f"{fault}: unclear error {exc!r}"
            if fault in ("nan_dense", "inf_dense"):
                assert "dense features must be finite" in str(exc), exc
            if fault == "huge_dense":
                assert "overflowed float32 inside the network" in str(exc), exc
            outcomes[(contract, fault, "refused")] += 1
        else:
            if fault == "huge_dense":  # answered only where every score stayed finite
                assert np.isfinite(got).all(), got
                outcomes[(contract, fault, "answered")] += 1
                check_good_request(model, module, client, rng)
                return
            assert samples is not None, f"{contract} request with fault {fault} was answered"
            dense, keys = samples
            model.check(got.reshape(len(keys), -1), dense, keys)
            outcomes[(contract, fault, "answered")] += 1
        check_good_request(model, module, client, rng)

    one()
    print(f"\n{protocol}: {sum(outcomes.values())} fuzzed requests, each followed by a good one")
    for (contract, fault, outcome), count in sorted(outcomes.items()):
        print(f"  {contract:8} {fault:18} {outcome:8} {count}")
    assert {o for _, _, o in outcomes} == {"answered", "refused"}, outcomes
    assert {f for _, f, _ in outcomes} == set(FAULTS), outcomes
    # Refused requests are answered with their error, not logged: the log stays as it started.
    log = server.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert len(log.splitlines()) < 400, f"{len(log.splitlines())} log lines"
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(NAME) and client.is_model_ready(f"{NAME}_samples")
    assert server.is_running
    # The models' own refusals are counted (Triton counts them as successes).
    refused_by_models = metric_sum(server, "hps_requests_failed_total", 'reason="invalid_argument"')
    assert (
        0
        < refused_by_models
        <= sum(n for (_, _, outcome), n in outcomes.items() if outcome == "refused") * 2
    )  # both protocols' runs, and this module's other protocol before


def metric_sum(server, name: str, label: str) -> float:
    """The sum of a counter's series carrying ``label`` on the server's metrics endpoint,
    once the instances' publishers had time to report (twice a second)."""
    time.sleep(1.2)
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )
