"""Served on the GPU: hps-triton's ranking model against the PyTorch peer, in one Triton server.

Both models take HugeCTR's ``hugectr`` contract (``DES``, ``CATCOLUMN``, ``ROWINDEX``) for
one-hot samples: ``--ps-json``'s model as ``hps repo`` writes it (its GPU pipeline,
``gpucacheper`` from ``--gpucacheper``), and ``<model>_pytorch``, the PyTorch DLRM of
``torch_dlrm.py`` with every table on the GPU, as a Python-backend model
(``triton_peer/model.py``). Same instance count on GPU 0, same dynamic batching, same
perf_analyzer input: Zipf samples, ``--samples`` a request, in as many different requests as
hold ``--distinct-samples`` samples (``ranking_load.REQUESTS`` to ``MAX_REQUESTS``: perf_analyzer
sends them in turn, so with few of them a partial cache holds every key they carry).
perf_analyzer over gRPC (``--shared-memory cuda`` for requests of more than one sample), per
concurrency; samples/s = infer/s x samples per request.

Usage:
    python benchmarks/ranking_serve_vs_pytorch.py --ps-json /tmp/dlrm/ps.json --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from pathlib import Path

from ps_variant import ps_variant
from ranking_load import REQUESTS, gpu_memory_mib, hit_rate, metric_sums, write_input
from result_table import write_results

from hps_core.config import load_ps_config
from hps_core.server.perf import PerfAnalyzerError, run_perf_analyzer
from hps_core.server.process import TritonServer
from hps_core.triton_repo import (
    InstanceGroup,
    ServingOptions,
    read_config,
    write_config,
    write_repository,
)

HERE = Path(__file__).resolve().parent
MAX_REQUESTS = 4096
"""Most different requests in an input (4,096 one-sample DLRM-v2 requests: 7.7 MB of JSON; 256
of 256 samples: 113 MB, written in 50 s on the 2-core machine)."""


def peer_folder(repo: Path, model: str, ps_json: Path) -> str:
    """Write ``<model>_pytorch`` next to ``model`` in ``repo``: its config.pbtxt is
    ``model``'s (same inputs, instances and batching, read and written as Triton's
    ``ModelConfig``) with the peer's name and parameters and no warm-up."""
    name = f"{model}_pytorch"
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    shutil.copy(HERE / "triton_peer" / "model.py", folder / "1" / "model.py")
    config = read_config(repo / model / "config.pbtxt")
    config.name = name
    del config.model_warmup[:]
    config.parameters.clear()
    params = {"ps_json": str(ps_json), "hps_model_name": model, "benchmarks_dir": str(HERE)}
    for key, value in params.items():
        config.parameters[key].string_value = value
    write_config(folder / "config.pbtxt", config)
    return name


def measure(
    name: str, url: str, data: Path, levels: list[int], args, extra: list[str], batch: int = 1
):
    """perf_analyzer at each concurrency, ``batch`` samples a request, after a warm-up run
    (fills caches and CUDA-graph buckets; its latencies drift, so no stability is asked of
    it); a measurement that does not stabilise is repeated with twice the tolerance."""
    with contextlib.suppress(PerfAnalyzerError):
        run_perf_analyzer(
            name, url, "grpc", data, [max(levels)], measurement_ms=args.window_ms,
            stability_percent=100.0, max_trials=3, extra_args=extra,
            batch_size=batch,
        )  # fmt: skip
    try:
        return run_perf_analyzer(
            name, url, "grpc", data, levels, measurement_ms=args.window_ms,
            stability_percent=args.stability, extra_args=extra, batch_size=batch,
        )  # fmt: skip
    except PerfAnalyzerError:
        return run_perf_analyzer(
            name, url, "grpc", data, levels, measurement_ms=args.window_ms,
            stability_percent=2 * args.stability, extra_args=extra,
            batch_size=batch,
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps-json", type=Path, required=True)
    parser.add_argument("--samples", default="1,1024", help="samples per request")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--gpucacheper", type=float, default=0.2)
    parser.add_argument(
        "--distinct-samples", type=int, default=65536, help="different samples in the input"
    )
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--stability", type=float, default=25.0)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ps_json = ps_variant(args.ps_json.resolve(), str(args.gpucacheper), tag="serve")
    model = load_ps_config(ps_json).models[0].name
    levels = [int(c) for c in args.concurrency.split(",")]
    results, logs = [], []
    with tempfile.TemporaryDirectory(prefix="hps-serve-peer-") as tmp:
        repo = Path(tmp) / "repo"
        options = ServingOptions(instances=(InstanceGroup(args.instances, "KIND_GPU"),))
        write_repository(ps_json, repo, options)
        for folder in repo.iterdir():
            if folder.name != model:
                shutil.rmtree(folder)
        peer = peer_folder(repo, model, ps_json)
        inputs = {}
        for samples in [int(s) for s in args.samples.split(",")]:
            inputs[samples] = Path(tmp) / f"input_{samples}.json"
            requests = max(REQUESTS, min(MAX_REQUESTS, args.distinct_samples // samples))
            write_input(ps_json, model, samples, args.alpha, inputs[samples], requests)
        with TritonServer(repo, startup_timeout_s=600, log_file=args.out / "server.log") as server:
            url = server.grpc_url
            for samples, data in inputs.items():
                extra = ["--shared-memory", "cuda"] if samples > 1 else []
                for name in (model, peer):
                    found, log = measure(name, url, data, levels, args, extra)
                    logs.append(log)
                    for r in found:
                        results.append(dict(
                            model=name, samples=samples, concurrency=r.concurrency,
                            samples_per_s=r.throughput * samples, infer_per_s=r.throughput,
                            p50_ms=r.p50_us / 1e3, p99_ms=r.p99_us / 1e3,
                        ))  # fmt: skip
            sums = metric_sums(
                server.metrics_url,
                ("hps_cache_hits_total", "hps_cache_misses_total"), "model",
            )  # fmt: skip
            memory = gpu_memory_mib()[0]
    (args.out / "serve_vs_pytorch.log").write_text("\n".join(logs))
    rate = hit_rate(sums.get(model, {"hps_cache_hits_total": 0, "hps_cache_misses_total": 0}))
    print(f"{args.instances} KIND_GPU instances each; gpucacheper {args.gpucacheper}; key hit "
          f"rate {rate:.3f}; GPU memory {memory} MiB in use while serving")  # fmt: skip
    columns = ["model", "samples", "concurrency", "samples_per_s", "infer_per_s", "p50_ms",
               "p99_ms"]  # fmt: skip
    write_results(args.out / "serve_vs_pytorch.csv", columns, results, ",.2f")


if __name__ == "__main__":
    main()
