"""Served: a PyTorch DLRM-v2 with its tables in the HPS (``hps repo-torch``) against the same
model from HugeCTR's files (``hps repo``'s ``<model>_samples``), in one Triton server
(issue 46's served target: the PyTorch model within 1.2x of the HugeCTR-file model's
samples/s).

Both take the samples contract (``dense`` float32 ``[13]``, ``sparse`` int64 ``[keys per
sample]`` -> ``score``) with the same instances and batching; the PyTorch model is
``torch_dlrm.HpsTablesDlrmV2`` (the dense file's weights, an ``hps_torchrec``
``EmbeddingBagCollection`` over the ps.json's tables). Their scores are compared first (1e-4),
then perf_analyzer (gRPC) sends the same Zipf samples, ``--samples`` a request (``-b``), at
each ``--concurrency``; its inferences/s are samples/s.

Usage (the files of ``make_large_dlrm.py --dcnv2``)::

    python benchmarks/torch_model_serve.py --ps-json /tmp/dlrm2/ps.json --out $OUT

``--kind KIND_CPU`` runs it on a CPU machine (a check of the script; no target there).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from ranking_serve_vs_pytorch import measure
from result_table import write_results

from hps_core.cli.main import main as hps_main
from hps_core.config import load_ps_config
from hps_core.infer import load_ranking_graph
from hps_core.server.process import TritonServer
from hps_core.triton_repo import InstanceGroup, ServingOptions, write_repository
from hps_core.workload import zipf_keys

HERE = Path(__file__).resolve().parent
MODULE = f'''"""The PyTorch DLRM-v2 of benchmarks/torch_dlrm.py, its tables in the HPS."""

import sys

sys.path.insert(0, {str(HERE)!r})
from torch_dlrm import hps_tables_dlrm_v2


def build(ps_config_file, model_name):
    return hps_tables_dlrm_v2(ps_config_file, model_name)
'''


def requests(ps_json: Path, model: str, samples: int, count: int, alpha: float):
    """``count`` requests of ``samples`` samples: dense features and each table's keys (Zipf
    over its rows, key i is row i), side by side as the samples contract takes them."""
    config = load_ps_config(ps_json).model(model)
    _, layout = load_ranking_graph(config)
    rng = np.random.default_rng(0)
    rows = [(t.sparse_file / "key").stat().st_size // 8 for t in config.tables]
    widths = [t.sample_width for t in layout.tables]
    found = []
    for _ in range(count):
        keys = np.concatenate([zipf_keys(rng, samples * w, r, alpha).reshape(samples, w)
                               for r, w in zip(rows, widths, strict=True)], axis=1)  # fmt: skip
        dense = rng.random((samples, config.maxnum_des_feature_per_sample), dtype=np.float32)
        found.append({"dense": dense.round(4), "sparse": keys.astype(np.int64)})
    return found


def write_input(found: list[dict[str, np.ndarray]], path: Path) -> None:
    """perf_analyzer's ``--input-data`` of the requests' samples, one entry each (with
    ``-b N`` it sends N of them a request and counts N inferences)."""
    data = [{name: {"content": a[i].tolist(), "shape": list(a.shape[1:])}
             for name, a in r.items()}
            for r in found for i in range(len(r["dense"]))]  # fmt: skip
    path.write_text(json.dumps({"data": data}))


def scores(url: str, model: str, request: dict[str, np.ndarray]) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url.removeprefix("grpc://"))
    try:
        inputs = []
        for name, array in request.items():
            tensor = grpcclient.InferInput(name, list(array.shape), "FP32" if
                                           array.dtype == np.float32 else "INT64")  # fmt: skip
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return client.infer(model, inputs).as_numpy("score")
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps-json", type=Path, required=True)
    parser.add_argument("--samples", default="1,256", help="samples per request")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--kind", default="KIND_GPU", choices=("KIND_GPU", "KIND_CPU"))
    parser.add_argument("--requests", type=int, default=64, help="different requests sent")
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--stability", type=float, default=25.0)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ps_json = args.ps_json.resolve()
    config = load_ps_config(ps_json)
    model = config.models[0].name
    sizes = [int(s) for s in args.samples.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    results, logs = [], []
    with tempfile.TemporaryDirectory(prefix="hps-torch-serve-") as tmp:
        repo = Path(tmp) / "repo"
        options = ServingOptions(
            max_batch_size=max(sizes), instances=(InstanceGroup(args.instances, args.kind),)
        )
        write_repository(ps_json, repo, options)
        samples_model, torch_model = f"{model}_samples", f"{model}_torch"
        (Path(tmp) / "dlrm_v2.py").write_text(MODULE)
        width = sum(t.sample_width for t in load_ranking_graph(config.models[0])[1].tables)
        dense = config.models[0].maxnum_des_feature_per_sample
        assert hps_main(["repo-torch", str(ps_json), str(repo), "--model", model,
                         "--name", torch_model, "--module", f"{tmp}/dlrm_v2.py:build",
                         "--input", f"dense:fp32:{dense}", "--input", f"sparse:int64:{width}",
                         "--instances", str(args.instances), "--kind", args.kind,
                         "--max-batch-size", str(max(sizes))]) == 0  # fmt: skip
        inputs = {}
        for samples in sizes:
            found = requests(ps_json, model, samples, args.requests, args.alpha)
            inputs[samples] = (Path(tmp) / f"input_{samples}.json", found[0])
            write_input(found, inputs[samples][0])
        with TritonServer(repo, startup_timeout_s=600, log_file=args.out / "server.log") as server:
            url = server.grpc_url
            for samples, (data, first) in inputs.items():
                want = scores(url, samples_model, first)
                got = scores(url, torch_model, first)
                diff = float(np.abs(got.reshape(want.shape) - want).max())
                assert diff <= 1e-4, f"{samples} samples: the models' scores differ by {diff}"
                for name in (samples_model, torch_model):
                    found, log = measure(name, url, data, levels, args, [], samples)
                    logs.append(log)
                    for r in found:
                        results.append(dict(
                            model=name, samples=samples, concurrency=r.concurrency,
                            samples_per_s=r.throughput, p50_ms=r.p50_us / 1e3,
                            p99_ms=r.p99_us / 1e3, max_abs_diff=diff,
                        ))  # fmt: skip
    (args.out / "torch_model_serve.log").write_text("\n".join(logs))
    base = {(r["samples"], r["concurrency"]): r["samples_per_s"]
            for r in results if r["model"] == samples_model}  # fmt: skip
    for r in results:
        r["vs_hugectr_files"] = r["samples_per_s"] / base[(r["samples"], r["concurrency"])]
    print(f"{args.instances} {args.kind} instances each; target: the PyTorch model's samples/s "
          "at least 1/1.2 of the HugeCTR-file model's")  # fmt: skip
    columns = ["model", "samples", "concurrency", "samples_per_s", "vs_hugectr_files", "p50_ms",
               "p99_ms", "max_abs_diff"]  # fmt: skip
    write_results(args.out / "torch_model_serve.csv", columns, results, ",.2f")


if __name__ == "__main__":
    main()
