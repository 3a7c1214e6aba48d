"""A DLRM-DCN in PyTorch with its tables in the HPS against the same module with
``torch.nn.EmbeddingBag`` tables in device memory (issue 46's benchmark).

The model is MLPerf DLRM-v2's shape written without TorchRec (the GPU machine cannot carry
FBGEMM's GPU wheel): 13 dense features through a bottom MLP (512, 256, 128), 26 tables of dim
128 pooled with MLPerf's multi-hot sizes, DCN v2 (3 layers of rank 512) over the 27 vectors,
then a top MLP (1024, 1024, 512, 256, 1). Table rows are MLPerf's capped at ``--max-rows``
(written once as HugeCTR sparse files under ``--dir``). Each table's ids are Zipf(``--alpha``).

Variants, each forward timed with CUDA events (median of ``--steps`` after ``--warm``):
- ``pytorch``: ``torch.nn.EmbeddingBag`` tables in HBM (the peer);
- ``hps static``: ``hps_torchrec.EmbeddingBagCollection`` over the files, the whole tables in
  the GPU cache (``gpucacheper`` 1.0);
- ``hps 0.2``: the same with a GPU cache of a fifth of each table, warmed by the warm-up
  batches (the misses read from the host tier over PCIe).
Each in eager mode and under ``torch.compile`` (the lookups stay outside the graph), FP32 and
TF32 matmuls. Every variant's scores are checked against the peer's (1e-4) before it is timed.

Run on a GPU::

    python benchmarks/torch_plugin_vs_pytorch.py --dir /tmp/tpp --out bench_results

``--device cpu --max-rows 2000 --batches 1,64`` checks the script on a CPU machine (the host
tier answers; timings there say nothing of the targets).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_large_dlrm import MLPERF_V2_TABLE_ROWS
from result_table import write_results

from hps_core import hps_torchrec
from hps_core.demo.zoo_networks import MLPERF_V2_HOTNESS
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.hps import HPS
from hps_core.jagged import KeyedJaggedTensor
from hps_core.workload import zipf_keys

DIM = 128
DENSE = 13
BOTTOM = (512, 256, DIM)
TOP = (1024, 1024, 512, 256, 1)
DCN_LAYERS, DCN_RANK = 3, 512
COLUMNS = ("variant", "mode", "precision", "batch", "ms", "samples_per_s", "vs_pytorch",
           "max_abs_diff", "runs")  # fmt: skip


def _mlp(sizes: list[int], last_relu: bool) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2 or last_relu:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class LowRankCrossNet(torch.nn.Module):
    """DCN v2's cross layers: x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l."""

    def __init__(self, width: int, layers: int, rank: int) -> None:
        super().__init__()
        self.v = torch.nn.ModuleList(
            torch.nn.Linear(width, rank, bias=False) for _ in range(layers)
        )
        self.w = torch.nn.ModuleList(torch.nn.Linear(rank, width) for _ in range(layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for v, w in zip(self.v, self.w, strict=True):
            x = x0 * w(v(x)) + x
        return x


class DlrmDcn(torch.nn.Module):
    """MLPerf DLRM-v2's shape over any pooled-table module taking a KeyedJaggedTensor and
    returning ``[batch, tables * DIM]`` (``.values()`` of a KeyedTensor, or a tensor)."""

    def __init__(self, tables: torch.nn.Module, num_tables: int) -> None:
        super().__init__()
        self.tables = tables
        self.bottom = _mlp([DENSE, *BOTTOM], last_relu=True)
        width = DIM * (num_tables + 1)
        self.cross = LowRankCrossNet(width, DCN_LAYERS, DCN_RANK)
        self.top = _mlp([width, *TOP], last_relu=False)

    def forward(self, dense: torch.Tensor, features) -> torch.Tensor:
        pooled = self.tables(features)
        pooled = pooled if isinstance(pooled, torch.Tensor) else pooled.values()
        return self.top(self.cross(torch.cat([self.bottom(dense), pooled], dim=1)))


class TorchTables(torch.nn.Module):
    """The peer: one ``torch.nn.EmbeddingBag`` per table (sum), fed the same features."""

    def __init__(self, weights: list[np.ndarray], names: list[str]) -> None:
        super().__init__()
        self.names = names
        self.bags = torch.nn.ModuleList(
            torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(w), mode="sum") for w in weights
        )

    def forward(self, features) -> torch.Tensor:
        starts, samples = features.offset_per_key(), features.stride()
        values, offsets = features.values(), features.offsets()
        pooled = []
        for i, bag in enumerate(self.bags):
            first = starts[i]
            bounds = offsets[i * samples : (i + 1) * samples] - first
            pooled.append(bag(values[first : starts[i + 1]], bounds))
        return torch.cat(pooled, dim=1)


def write_tables(folder: Path, rows: list[int], seed: int) -> tuple[list[np.ndarray], list[str]]:
    """Write (once) and return each table's rows, row ``i`` under key ``i``."""
    names = [f"t_cat_{i}" for i in range(len(rows))]
    weights = []
    for i, (name, n) in enumerate(zip(names, rows, strict=True)):
        path = folder / name
        rng = np.random.default_rng(seed + i)
        vectors = (rng.standard_normal((n, DIM), dtype=np.float32) * 0.05).astype(np.float32)
        if not (path / "emb_vector").is_file():
            write_sparse_table(path, np.arange(n, dtype=np.int64), vectors)
        weights.append(vectors)
    return weights, names


def write_ps_json(folder: Path, names: list[str], hotness: list[int], cache_share: float,
                  max_batch: int) -> Path:  # fmt: skip
    """A ps.json of one model over the tables, with a GPU cache of ``cache_share``."""
    static = cache_share >= 1.0
    model = {
        "model": "dlrm_dcn", "sparse_files": [str(folder / n) for n in names],
        "embedding_table_names": names, "embedding_vecsize_per_table": [DIM] * len(names),
        "maxnum_catfeature_query_per_table_per_sample": hotness, "max_batch_size": max_batch,
        "gpucache": True, "gpucacheper": min(cache_share, 1.0), "use_static_table": static,
        "deployed_device_list": [0], "default_value_for_each_table": [0.0] * len(names),
    }  # fmt: skip
    path = folder / f"ps_{'static' if static else cache_share}.json"
    path.write_text(json.dumps({"supportlonglong": True, "models": [model]}, indent=1))
    return path


def features(rng: np.random.Generator, rows: list[int], hotness: list[int], batch: int,
             alpha: float, device: torch.device):  # fmt: skip
    """A KeyedJaggedTensor of ``batch`` samples, each table's fixed hotness of Zipf ids,
    knowing each feature's number of ids (``length_per_key``), as a data loader that built it
    on the host does: neither module then reads the lengths back from the GPU."""
    ids = [zipf_keys(rng, batch * h, n, alpha, permutation_seed=t)
           for t, (n, h) in enumerate(zip(rows, hotness, strict=True))]  # fmt: skip
    lengths = np.repeat(np.asarray(hotness, dtype=np.int32), batch)
    return KeyedJaggedTensor(
        keys=[f"cat_{t}" for t in range(len(rows))],
        values=torch.from_numpy(np.concatenate(ids)).to(device),
        lengths=torch.from_numpy(lengths).to(device),
        length_per_key=[batch * h for h in hotness],
    )


def timed(model, dense, batches, device: torch.device, warm: int, steps: int) -> float:
    """Median milliseconds of one forward over ``batches`` (cycled)."""
    cuda = device.type == "cuda"
    times = []
    with torch.inference_mode():
        for step in range(warm + steps):
            kjt = batches[step % len(batches)]
            if cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                model(dense, kjt)
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end)
            else:
                began = time.perf_counter()
                model(dense, kjt)
                elapsed = (time.perf_counter() - began) * 1e3
            if step >= warm:
                times.append(elapsed)
    return statistics.median(times)


def models(
    folder: Path, max_rows: int, caches: list[str], max_batch: int, device: torch.device
) -> tuple[dict[str, torch.nn.Module], list[int], list[int]]:
    """The peer and the module with its tables in the HPS, one per cache of ``caches``
    (``static`` or a share), the same dense weights, in eval mode on ``device``.

    Args:
        folder: where the tables and ps.json files are written (once).
        max_rows: the cap on MLPerf's rows per table.
        caches: the HPS variants' caches.
        max_batch: the ps.json's ``max_batch_size``.
        device: where the modules run.

    Returns:
        The modules by name (``pytorch`` first, then ``hps CACHE``), each table's rows and
        each table's hotness.
    """
    rows = [min(n, max_rows) for n in MLPERF_V2_TABLE_ROWS]
    hotness = list(MLPERF_V2_HOTNESS)
    folder.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    weights, names = write_tables(folder, rows, seed=7)
    gb, took = sum(rows) * DIM * 4 / 1e9, time.perf_counter() - began
    print(f"tables: {len(rows)} x dim {DIM}, {sum(rows):,} rows, {gb:.2f} GB FP32, {took:.1f} s")
    torch.manual_seed(0)
    peer = DlrmDcn(TorchTables(weights, names), len(rows)).to(device).eval()
    dense_state = {k: v for k, v in peer.state_dict().items() if not k.startswith("tables.")}
    variants: dict[str, torch.nn.Module] = {"pytorch": peer}
    for cache in caches:
        share = 1.0 if cache == "static" else float(cache)
        ps = write_ps_json(folder, names, hotness, share, max_batch)
        specs = [hps_torchrec.TableSpec(n, DIM, (f"cat_{t}",)) for t, n in enumerate(names)]
        ours = DlrmDcn(hps_torchrec.EmbeddingBagCollection(ps, "dlrm_dcn", specs), len(rows))
        ours.load_state_dict(dense_state, strict=True)
        variants[f"hps {cache}"] = ours.to(device).eval()
    return variants, rows, hotness


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/torch_plugin_tables"))
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-rows", type=int, default=1_000_000)
    parser.add_argument("--batches", default="1,64,1024,16384")
    parser.add_argument("--precisions", default="fp32,tf32")
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--caches", default="static,0.2")
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    batches = [int(b) for b in args.batches.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    variants, rows, hotness = models(
        args.dir, args.max_rows, args.caches.split(","), max(batches), device
    )
    peer = variants["pytorch"]
    rng = np.random.default_rng(1)
    results = []
    for batch in batches:
        inputs = [features(rng, rows, hotness, batch, args.alpha, device) for _ in range(4)]
        dense = torch.randn(batch, DENSE, device=device)
        with torch.inference_mode():
            want = peer(dense, inputs[0])
        for precision in args.precisions.split(","):
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            torch.backends.cudnn.allow_tf32 = precision == "tf32"
            base = None
            for mode in args.modes.split(","):
                for name, model in variants.items():
                    run = torch.compile(model) if mode == "compile" else model
                    with torch.inference_mode():
                        got = run(dense, inputs[0])
                    diff = float((got - want).abs().max())
                    if diff > 1e-4 * max(1.0, float(want.abs().max())) and precision == "fp32":
                        print(f"{name} {mode} batch {batch}: scores differ from the peer's by "
                              f"{diff:g}", file=sys.stderr)  # fmt: skip
                        return 1
                    ms = timed(run, dense, inputs, device, args.warm, args.steps)
                    if name == "pytorch":
                        base = ms
                    results.append({
                        "variant": name, "mode": mode, "precision": precision, "batch": batch,
                        "ms": ms, "samples_per_s": batch / ms * 1e3,
                        "vs_pytorch": base / ms if base else float("nan"),
                        "max_abs_diff": diff, "runs": args.steps,
                    })  # fmt: skip
        # After each batch size: a run cut short by its time limit keeps what it measured.
        write_results(args.out / "torch_plugin_vs_pytorch.csv", COLUMNS, results)
    HPS.close_all()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\n{device_name}; vs_pytorch > 1: the HPS tables are faster")
    write_results(args.out / "torch_plugin_vs_pytorch.csv", COLUMNS, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
