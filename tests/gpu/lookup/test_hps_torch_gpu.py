"""hps_torch and hps_torchrec on CUDA tensors, through the GPU lookup engine (the cache bank):
LookupLayer, EmbeddingBag and both TorchRec-shaped collections answer on the keys' device as
on the CPU (the host tier) and as the files' rows; work queued after a lookup on PyTorch's
current stream (a side stream, not the default) sees its answer; a compiled model answers as
the eager one."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no CUDA device", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "lookup"))
from lookup_testdata import write_models  # noqa: E402

from hps_core import hps_torch, hps_torchrec  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.jagged import _KeyedJaggedTensor  # noqa: E402

CUDA = torch.device("cuda", 0)


def test_lookup_layer_and_embedding_bag_answer_on_the_gpu_as_on_the_host(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    table = data["wdl"][1]
    dim = table.vectors.shape[1]
    layer = hps_torch.LookupLayer(ps, "wdl", 1, dim)
    bag = hps_torch.EmbeddingBag(ps, "wdl", 1, dim, mode="mean")
    rng = np.random.default_rng(0)
    for n in (1, 37, 4096):
        keys = torch.from_numpy(table.queries(rng, n)[:n])
        on_gpu = layer(keys.to(CUDA))
        assert on_gpu.device == CUDA and on_gpu.dtype == torch.float32
        np.testing.assert_array_equal(on_gpu.cpu().numpy(), table.expected(keys.numpy()))
        np.testing.assert_array_equal(on_gpu.cpu().numpy(), layer(keys).numpy())
        starts = torch.from_numpy(np.sort(rng.integers(0, n + 1, max(n // 4, 1))))
        starts[0] = 0
        pooled = bag(keys.to(CUDA), starts.to(CUDA))
        torch.testing.assert_close(pooled.cpu(), bag(keys, starts), rtol=1e-6, atol=1e-6)


def test_a_lookup_on_a_side_stream_is_seen_by_what_follows_on_it(tmp_path: Path) -> None:
    """The lookup is ordered on PyTorch's current stream: a kernel queued after it on that
    stream (no synchronisation between) reads the answer."""
    ps, data = write_models(tmp_path)
    table = data["wdl"][1]
    layer = hps_torch.LookupLayer(ps, "wdl", 1, table.vectors.shape[1])
    keys = torch.from_numpy(table.queries(np.random.default_rng(1), 50_000)[:50_000]).to(CUDA)
    side = torch.cuda.Stream(CUDA)
    side.wait_stream(torch.cuda.current_stream(CUDA))
    with torch.cuda.stream(side):
        for _ in range(3):
            doubled = layer(keys) * 2.0  # queued on the side stream after the lookup
    side.synchronize()
    want = table.expected(keys.cpu().numpy()) * 2.0
    np.testing.assert_array_equal(doubled.cpu().numpy(), want)


def test_collections_answer_on_the_gpu_as_on_the_host(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    dims = [t.vectors.shape[1] for t in data["wdl"]]
    config = HPS(ps).config.model("wdl")
    t0, t1 = config.embedding_table_names
    spec = hps_torchrec.TableSpec
    ebc = hps_torchrec.EmbeddingBagCollection(
        ps, "wdl", [spec(t0, dims[0], ("a",)), spec(t1, dims[1], ("b", "c"), "mean")]
    )
    ec = hps_torchrec.EmbeddingCollection(ps, "wdl", [spec(t1, dims[1], ("b",))])
    rng = np.random.default_rng(2)
    for samples in (1, 64, 2048):
        lengths = rng.integers(0, 6, 3 * samples)
        values = np.concatenate([
            data["wdl"][0 if i < samples else 1].queries(rng, int(n) + 1)[: int(n)]
            for i, n in enumerate(lengths)
        ]).astype(np.int64)  # fmt: skip
        host = _KeyedJaggedTensor(["a", "b", "c"], torch.from_numpy(values),
                                  lengths=torch.from_numpy(lengths))  # fmt: skip
        gpu = _KeyedJaggedTensor(["a", "b", "c"], host.values().to(CUDA),
                                 lengths=host.lengths().to(CUDA))  # fmt: skip
        got, want = ebc(gpu), ebc(host)
        assert got.values().device == CUDA
        torch.testing.assert_close(got.values().cpu(), want.values(), rtol=1e-6, atol=1e-6)
        rows_gpu, rows_host = ec(gpu)["b"], ec(host)["b"]
        torch.testing.assert_close(rows_gpu.values().cpu(), rows_host.values(), rtol=0, atol=0)
        assert torch.equal(rows_gpu.lengths().cpu(), rows_host.lengths())


def test_a_compiled_model_on_the_gpu_answers_as_eager(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    table = data["wdl"][1]
    dim = table.vectors.shape[1]

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rows = hps_torch.LookupLayer(ps, "wdl", 1, dim)
            self.linear = torch.nn.Linear(dim, 1)

        def forward(self, keys: torch.Tensor) -> torch.Tensor:
            return self.linear(self.rows(keys).sum(dim=1))

    model = Model().to(CUDA).eval()
    compiled = torch.compile(model, fullgraph=True)
    keys = torch.from_numpy(table.queries(np.random.default_rng(3), 512 * 4)[: 512 * 4])
    keys = keys.reshape(512, 4).to(CUDA)
    with torch.no_grad():
        torch.testing.assert_close(compiled(keys), model(keys), rtol=1e-5, atol=1e-5)
