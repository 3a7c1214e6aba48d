"""Users' PyTorch models served by a real tritonserver with their tables in the HPS: TorchRec's
DLRM_DCN (client_examples/torch/dlrm_dcn.py) and a sequence model of NV Embedding Cache's HSTU
sample's shape (client_examples/torch/hstu_like.py: unpooled jagged lookups and a transformer
block), each trained with TorchRec's own tables and converted by ``hps convert torchrec``, and
HugeCTR's hps_torch demo model (client_examples/torch/hps_torch_demo.py: LookupLayers under
torch.jit.fork over static tables of 32-bit keys), its folder written by ``hps repo-torch``,
answer as the same module with PyTorch's own tables (1e-5) over HTTP and gRPC, one sample to a
full batch, under concurrent load (Triton batching requests into one forward); a bad request
fails alone."""

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

pytestmark = [
    pytest.mark.integration,
    # The demo model runs its lookups under torch.jit.fork, as HugeCTR's notebook does.
    pytest.mark.filterwarnings("ignore:`torch.jit.(fork|wait)` is deprecated:DeprecationWarning"),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "client_examples" / "torch"
MODELS = ("dlrm_dcn", "hstu_like", "hps_torch_demo")
MAX_BATCH = 64


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as load_module does: dataclasses look it up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(module_triton_server, tmp_path_factory: pytest.TempPathFactory):
    """Both models in one repository: their references (TorchRec's tables) and examples."""
    root = tmp_path_factory.mktemp("torch_models")
    found = {}
    for seed, name in enumerate(MODELS):
        example = _example(name)
        torch.manual_seed(seed)
        weights, tables = root / f"{name}.pt", root / f"{name}_tables"
        if hasattr(example, "torchrec_collection"):  # trained with TorchRec's tables
            reference = example.served_module(example.torchrec_collection()).eval()
            torch.save(reference.state_dict(), weights)
            assert main(["convert", "torchrec", "--state-dict", str(weights), "--model-name",
                         name, "--out", str(tables)]) == 0  # fmt: skip
        else:  # HugeCTR's files, and the same rows as plain PyTorch tables
            tables.mkdir()
            _, rows = example.write_tables(tables, seed)
            reference = example.served_module(example.plain_tables(rows)).eval()
            dense = {k: v for k, v in reference.state_dict().items() if k.startswith("mlp.")}
            torch.save(dense, weights)
        inputs = [arg for spec in example.INPUTS for arg in ("--input", spec)]
        batching = ["--instances", "2", "--max-batch-size", str(MAX_BATCH)]
        assert main(["repo-torch", str(tables / "ps.json"), str(root / "repo"), "--model", name,
                     "--module", f"{EXAMPLES / name}.py:build", "--state-dict", str(weights),
                     *inputs, *batching]) == 0  # fmt: skip
        found[name] = (reference, example)
    return module_triton_server(root / "repo", startup_timeout_s=240), found


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


def _ask(module, client, name: str, request: dict[str, np.ndarray]) -> np.ndarray:
    return infer(module, client, name, tuple(request.values()), tuple(request), "score")


def _want(reference, request: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return reference(**{k: torch.from_numpy(v) for k, v in request.items()}).numpy()


@pytest.mark.parametrize("name", MODELS)
def test_the_served_module_answers_as_with_torchrecs_own_tables(served, name: str) -> None:
    server, models = served
    reference, example = models[name]
    rng = np.random.default_rng(0)
    with _clients(server) as made:
        for (module, client), batch in itertools.product(made, (1, 5, MAX_BATCH)):
            request = example.sample_inputs(rng, batch)
            got = _ask(module, client, name, request)
            assert got.shape == (batch, 1) and got.dtype == np.float32
            np.testing.assert_allclose(got, _want(reference, request), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_concurrent_requests_are_batched_and_each_answered_alone(served, name: str) -> None:
    server, models = served
    reference, example = models[name]
    rng = np.random.default_rng(1)
    requests = [example.sample_inputs(rng, int(rng.integers(1, 9))) for _ in range(64)]
    local = threading.local()  # a client per thread: tritonclient's are not thread-safe
    with contextlib.ExitStack() as made:

        def ask(request):
            if not hasattr(local, "client"):
                local.client = made.enter_context(_clients(server))[0]
            return _ask(*local.client, name, request)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, requests))
    for request, got in zip(requests, answers, strict=True):
        np.testing.assert_allclose(got, _want(reference, request), rtol=1e-5, atol=1e-6)
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    looked_up = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hps_lookup_keys_total{") and f'model="{name}"' in line
    ]
    assert looked_up and sum(looked_up) > 0  # the module's lookups count as the model's


def test_a_bad_request_fails_alone(served) -> None:
    server, models = served
    reference, example = models["dlrm_dcn"]
    request = example.sample_inputs(np.random.default_rng(2), 3)
    with _clients(server) as made:
        (module, client), _ = made
        wrong_type = request | {"sparse": request["sparse"].astype(np.int32)}
        with pytest.raises(Exception, match=r"sparse.*(INT32|int32|data-type|datatype)"):
            _ask(module, client, "dlrm_dcn", wrong_type)
        with pytest.raises(Exception, match="sparse"):  # a sample of 3 ids, not 4
            _ask(module, client, "dlrm_dcn", request | {"sparse": request["sparse"][:, :3].copy()})
        got = _ask(module, client, "dlrm_dcn", request)
    np.testing.assert_allclose(got, _want(reference, request), rtol=1e-5, atol=1e-6)
