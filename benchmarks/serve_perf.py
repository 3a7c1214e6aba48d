"""perf_analyzer throughput and latency of served default models.

Starts tritonserver on loopback with the default repository (``hps prepare``; ``--kind
KIND_GPU`` puts the instances on GPU 0), writes Zipf (alpha 1.05) perf_analyzer inputs and
measures each model, protocol and concurrency:

- ``hps_embedding``: one request = 26 keys per table (the ``hps`` contract), ``-b 1``;
- ``<ranking>_samples`` (e.g. ``dlrm_samples``): one request = ``--samples-per-request``
  one-hot samples (13 dense features, one key per slot), ``-b N``.

Prints a table; writes ``serve_perf.csv``, the raw perf_analyzer output and, for more than two
concurrency levels, a plot of throughput against concurrency (``serve_perf.png``) to ``--out``.

Usage:
    python benchmarks/serve_perf.py                        # hps_embedding, gRPC+HTTP, conc. 1, 8
    python benchmarks/serve_perf.py --models hps_embedding,dlrm_samples --kind KIND_GPU
    python benchmarks/serve_perf.py --models din_samples,bst_samples --protocols grpc  # zoo
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from hps_core.config import load_ps_config
from hps_core.demo import DEMO_MODELS, ZOO_MODELS
from hps_core.formats.sparse import KEY_DTYPE, KEY_FILE
from hps_core.server.perf import PerfResult, run_perf_analyzer
from hps_core.server.process import TritonServer
from hps_core.triton_repo import InstanceGroup, ServingOptions
from hps_core.workload import zipf_keys

ROOT = Path(__file__).resolve().parents[1]


def samples_input(repo: Path, model: str, alpha: float, entries: int, path: Path) -> None:
    """perf_analyzer input for a ``_samples`` model: one-hot Zipf keys of each table."""
    config = load_ps_config(repo / model / "ps.json").model(model)
    rng = np.random.default_rng(0)
    columns = []
    for table in config.tables:
        keys = np.fromfile(table.sparse_file / KEY_FILE, dtype=KEY_DTYPE)
        slots = table.max_query_per_sample  # one-hot: one key per slot
        ranks = zipf_keys(rng, entries * slots, len(keys), alpha).reshape(entries, slots)
        columns.append(keys[ranks])
    sparse = np.concatenate(columns, axis=1)
    dense = rng.random((entries, config.maxnum_des_feature_per_sample), dtype=np.float32)
    data = [
        {"dense": {"content": d.tolist(), "shape": [len(d)]},
         "sparse": {"content": k.tolist(), "shape": [len(k)]}}
        for d, k in zip(dense, sparse, strict=True)
    ]  # fmt: skip
    path.write_text(json.dumps({"data": data}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="hps_embedding", help="comma-separated")
    parser.add_argument("--kind", default="KIND_CPU", choices=("KIND_CPU", "KIND_GPU"))
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--samples-per-request", type=int, default=64)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--protocols", default="grpc,http")
    parser.add_argument("--keys-per-table", default="26,26")
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--window-ms", type=int, default=5000)
    parser.add_argument("--stability", type=float, default=10.0, help="perf_analyzer -s")
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    levels = [int(c) for c in args.concurrency.split(",")]
    results, logs = [], []
    options = ServingOptions(instances=(InstanceGroup(args.instances, args.kind),))
    models = args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="hps-serve-perf-") as tmp:
        repo = Path(tmp) / "repo"
        inputs = {}
        writers = {**DEMO_MODELS, **ZOO_MODELS}
        for model in models:
            base = model.removesuffix("_samples")
            writers[base](repo, options)
            inputs[model] = Path(tmp) / f"{model}.json"
            if model == base:
                subprocess.run(
                    [sys.executable, str(ROOT / "client_examples" / "make_perf_input.py"),
                     "--keys-per-table", args.keys_per_table, "--alpha", str(args.alpha),
                     "--samples", "256", "--out", str(inputs[model])],
                    check=True, capture_output=True,
                )  # fmt: skip
            else:
                samples_input(repo, base, args.alpha, 256, inputs[model])
        with TritonServer(repo, startup_timeout_s=300) as server:
            for model in models:
                batch = args.samples_per_request if model.endswith("_samples") else 1
                for protocol in args.protocols.split(","):
                    url = getattr(server, f"{protocol}_url").split("//")[-1]
                    found, log = run_perf_analyzer(
                        model, url, protocol, inputs[model], levels,
                        measurement_ms=args.window_ms, stability_percent=args.stability,
                        batch_size=batch,
                    )  # fmt: skip
                    results += [(model, batch, r) for r in found]
                    logs.append(log)
    device = "GPU 0" if args.kind == "KIND_GPU" else "CPU"
    print(
        f"host: {platform.node()} ({os.cpu_count()} cores); {args.instances} {device} instances "
        f"per model, dynamic batching; hps_embedding: {args.keys_per_table} keys per table per "
        f"request; _samples models: {args.samples_per_request} samples per request; Zipf alpha "
        f"{args.alpha}; window {args.window_ms} ms, stability {args.stability}%"
    )
    head = f"{'model':>14} {'batch':>5} {'protocol':>8} {'conc':>5} {'infer/s':>9}"
    print(f"{head} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}")
    for model, batch, r in results:
        print(
            f"{model:>14} {batch:>5} {r.protocol:>8} {r.concurrency:>5} {r.throughput:>9.1f} "
            f"{r.p50_us / 1e3:>8.2f} {r.p90_us / 1e3:>8.2f} {r.p99_us / 1e3:>8.2f}"
        )
    fields = ["model", "kind", "batch", *[x.name for x in dataclasses.fields(PerfResult)]]
    with (out / "serve_perf.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for model, batch, r in results:
            writer.writerow(
                {"model": model, "kind": args.kind, "batch": batch, **dataclasses.asdict(r)}
            )
    (out / "serve_perf.log").write_text("\n".join(logs))
    print(f"wrote {out / 'serve_perf.csv'}")
    if len(levels) > 2:
        plot(results, out / "serve_perf.png", args.samples_per_request)


def plot(results: list, path: Path, samples: int) -> None:
    """Throughput against concurrency, one line per model and protocol (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    lines: dict[str, list[tuple[int, float]]] = {}
    for model, _, r in results:
        lines.setdefault(f"{model} ({r.protocol})", []).append((r.concurrency, r.throughput))
    for label, points in sorted(lines.items()):
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests (perf_analyzer --concurrency-range)")
    ax.set_ylabel(f"inferences/s (_samples models: samples/s, {samples} per request)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
