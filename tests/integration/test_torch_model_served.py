"""A user's PyTorch model served by a real tritonserver with its tables in the HPS: TorchRec's
DLRM_DCN (client_examples/torch/dlrm_dcn.py) trained with TorchRec's own tables, its tables
converted by ``hps convert torchrec``, its folder written by ``hps repo-torch``, answers as the
same module with TorchRec's tables (1e-5) over HTTP and gRPC, one sample to a full batch, under
concurrent load (Triton batching requests into one forward); a bad request fails alone."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import sys
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from hps_core.cli.main import main  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ranking_models import clients, infer  # noqa: E402

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "client_examples" / "torch" / "dlrm_dcn.py"
MAX_BATCH = 64


def _example():
    spec = importlib.util.spec_from_file_location("dlrm_dcn_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(module_triton_server, tmp_path_factory: pytest.TempPathFactory):
    import torchrec

    example = _example()
    root = tmp_path_factory.mktemp("torch_model")
    torch.manual_seed(3)
    cpu = torch.device("cpu")
    ebc = torchrec.EmbeddingBagCollection(tables=example.table_configs(), device=cpu)
    reference = example.served_module(ebc).eval()
    torch.save(reference.state_dict(), root / "model.pt")
    assert main(["convert", "torchrec", "--state-dict", str(root / "model.pt"),
                 "--model-name", "dlrm_dcn", "--out", str(root / "tables")]) == 0  # fmt: skip
    features = len(example.TABLE_ROWS) * example.HOTNESS
    assert main(["repo-torch", str(root / "tables" / "ps.json"), str(root / "repo"),
                 "--model", "dlrm_dcn", "--module", f"{EXAMPLE}:build",
                 "--state-dict", str(root / "model.pt"), "--input", "dense:fp32:13",
                 "--input", f"sparse:int64:{features}", "--instances", "2",
                 "--max-batch-size", str(MAX_BATCH)]) == 0  # fmt: skip
    server = module_triton_server(root / "repo", startup_timeout_s=180)
    return server, reference, example


def _samples(rng: np.random.Generator, example, batch: int) -> tuple[np.ndarray, np.ndarray]:
    dense = rng.standard_normal((batch, example.DENSE_FEATURES), dtype=np.float32)
    sparse = np.stack(
        [rng.integers(0, rows, (batch, example.HOTNESS)) for rows in example.TABLE_ROWS], axis=1
    ).reshape(batch, -1)
    return dense, sparse.astype(np.int64)


@contextlib.contextmanager
def _clients(server) -> Iterator[list]:
    """HTTP and gRPC clients, closed at the end: an open connection holds the server's stop
    for its whole exit timeout, after which it kills the stubs instead of unloading them."""
    made = clients(server)
    try:
        yield made
    finally:
        for _, client in made:
            client.close()


def _want(reference, dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return reference(torch.from_numpy(dense), torch.from_numpy(sparse)).numpy()


def test_the_served_module_answers_as_with_torchrecs_own_tables(served) -> None:
    server, reference, example = served
    rng = np.random.default_rng(0)
    with _clients(server) as made:
        for (module, client), batch in itertools.product(made, (1, 5, MAX_BATCH)):
            dense, sparse = _samples(rng, example, batch)
            got = infer(module, client, "dlrm_dcn", (dense, sparse), ("dense", "sparse"), "score")
            assert got.shape == (batch, 1) and got.dtype == np.float32
            np.testing.assert_allclose(got, _want(reference, dense, sparse), rtol=1e-5, atol=1e-6)


def test_concurrent_requests_are_batched_and_each_answered_alone(served) -> None:
    server, reference, example = served
    rng = np.random.default_rng(1)
    requests = [_samples(rng, example, int(rng.integers(1, 9))) for _ in range(64)]
    local = threading.local()  # a client per thread: tritonclient's are not thread-safe
    with contextlib.ExitStack() as made:

        def ask(request):
            if not hasattr(local, "client"):
                local.client = made.enter_context(_clients(server))[0]
            module, client = local.client
            dense, sparse = request
            return infer(module, client, "dlrm_dcn", (dense, sparse), ("dense", "sparse"),
                         "score")  # fmt: skip

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, requests))
    for (dense, sparse), got in zip(requests, answers, strict=True):
        np.testing.assert_allclose(got, _want(reference, dense, sparse), rtol=1e-5, atol=1e-6)
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    looked_up = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hps_lookup_keys_total{") and 'model="dlrm_dcn"' in line
    ]
    assert looked_up and sum(looked_up) > 0  # the module's lookups count as the model's


def test_a_bad_request_fails_alone(served) -> None:
    server, reference, example = served
    rng = np.random.default_rng(2)
    dense, sparse = _samples(rng, example, 3)
    names = ("dense", "sparse")
    with _clients(server) as made:
        (module, client), _ = made
        with pytest.raises(Exception, match=r"sparse.*(INT32|int32|data-type|datatype)"):
            infer(module, client, "dlrm_dcn", (dense, sparse.astype(np.int32)), names, "score")
        with pytest.raises(Exception, match="sparse"):  # a sample of 3 ids, not 4
            infer(module, client, "dlrm_dcn", (dense, sparse[:, :3].copy()), names, "score")
        got = infer(module, client, "dlrm_dcn", (dense, sparse), names, "score")
    np.testing.assert_allclose(got, _want(reference, dense, sparse), rtol=1e-5, atol=1e-6)
