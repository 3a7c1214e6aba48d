"""Serving with GPU caches shared by the instances on one GPU vs one private copy each.

Serves a ranking model (HugeCTR ``hugectr`` contract, the ``<model>`` folder of ``hps repo``)
with N KIND_GPU instances on GPU 0, once with ``share_gpu_cache: true`` and once with
``false``, each on a fresh server, and measures with perf_analyzer (gRPC): throughput,
latency, GPU memory in use (nvidia-smi) and the hit rate of the caches (metrics endpoint).

Each perf_analyzer request carries ``--samples`` one-hot samples with Zipf (``--alpha``)
keys per table, 16 different requests in turn. A first pass at the highest concurrency warms
the caches; the measured passes follow on the same server.

Prints a table; writes ``shared_cache_serve.csv`` and the raw perf_analyzer output to ``--out``.

Usage:
    python benchmarks/make_large_dlrm.py --out /tmp/dlrm --max-rows-per-table 1000000
    python benchmarks/shared_cache_serve.py --ps-json /tmp/dlrm/ps.json --out results
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

from ranking_load import (
    add_load_arguments,
    gpu_memory_mib,
    hit_rate,
    metric_sums,
    write_input,
    write_model_repository,
)

from hps_core.server.perf import PerfAnalyzerError, run_perf_analyzer
from hps_core.server.process import TritonServer
from hps_core.triton_repo import InstanceGroup, ServingOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_load_arguments(parser, concurrency="2,8")
    parser.add_argument("--instances", type=int, default=2)
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    levels = [int(c) for c in args.concurrency.split(",")]
    source = Path(args.ps_json).resolve()
    ps = json.loads(source.read_text())
    model = ps["models"][0]["model"]
    rows, logs = [], []
    with tempfile.TemporaryDirectory(prefix="hps-shared-cache-") as tmp:
        # The ps.json beside the model files, with the cache settings of this run.
        ps["models"][0].update(gpucache=True, gpucacheper=args.gpucacheper, hit_rate_threshold=0.9)
        ps_json = source.with_name(f"ps_shared_bench_{args.gpucacheper}.json")
        ps_json.write_text(json.dumps(ps, indent=1))
        perf_input = Path(tmp) / "input.json"
        write_input(ps_json, model, args.samples, args.alpha, perf_input)
        idle = gpu_memory_mib()[0]
        for share in (True, False):
            repo = Path(tmp) / f"repo-{share}"
            options = ServingOptions(
                instances=(InstanceGroup(args.instances, "KIND_GPU", (0,)),),
                share_gpu_cache=share,
            )
            write_model_repository(ps_json, model, repo, options)
            started = time.perf_counter()
            with TritonServer(repo, startup_timeout_s=900) as server:
                load_s = time.perf_counter() - started
                url = server.grpc_url.split("//")[-1]
                # Warm-up: fills the caches; its latencies drift, so stability is not asked.
                with contextlib.suppress(PerfAnalyzerError):
                    run_perf_analyzer(
                        model, url, "grpc", perf_input, [max(levels)],
                        measurement_ms=args.window_ms, stability_percent=100.0, max_trials=3,
                    )  # fmt: skip
                stability = args.stability
                try:
                    found, log = run_perf_analyzer(
                        model, url, "grpc", perf_input, levels,
                        measurement_ms=args.window_ms, stability_percent=stability,
                    )  # fmt: skip
                except PerfAnalyzerError:
                    stability *= 2  # reported in the table
                    found, log = run_perf_analyzer(
                        model, url, "grpc", perf_input, levels,
                        measurement_ms=args.window_ms, stability_percent=stability,
                    )  # fmt: skip
                logs.append(log)
                memory = gpu_memory_mib()[0] - idle
                names = ("hps_cache_hits_total", "hps_cache_misses_total", "hps_lookups_total")
                [sums] = metric_sums(server.metrics_url, names, by="model").values()
                rate, lookups = hit_rate(sums), int(sums["hps_lookups_total"])
            for r in found:
                rows.append(
                    {
                        "share_gpu_cache": share,
                        "instances": args.instances,
                        "samples_per_request": args.samples,
                        "concurrency": r.concurrency,
                        "infer_per_s": r.throughput,
                        "samples_per_s": r.throughput * args.samples,
                        "p50_ms": r.p50_us / 1e3,
                        "p99_ms": r.p99_us / 1e3,
                        "gpu_mib": memory,
                        "hit_rate": rate,
                        "lookups": lookups,
                        "load_s": load_s,
                        "stability_percent": stability,
                    }
                )
    print(
        f"{model}: {args.instances} KIND_GPU instances on GPU 0, {args.samples} samples per "
        f"request, Zipf {args.alpha}, gpucacheper {args.gpucacheper}, gRPC, window "
        f"{args.window_ms} ms, stability {args.stability}%; GPU MiB = in use while serving "
        f"minus before the server started"
    )
    print(
        f"{'shared':>6} {'conc':>4} {'infer/s':>8} {'samples/s':>10} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'GPU MiB':>8} {'hit rate':>8} {'load s':>6}"
    )
    for r in rows:
        print(
            f"{r['share_gpu_cache']!s:>6} {r['concurrency']:>4} {r['infer_per_s']:>8.1f} "
            f"{r['samples_per_s']:>10.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['gpu_mib']:>8} {r['hit_rate']:>8.3f} {r['load_s']:>6.1f}"
        )
    with (out / "shared_cache_serve.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "shared_cache_serve.log").write_text("\n".join(logs))
    print(f"wrote {out / 'shared_cache_serve.csv'}")


if __name__ == "__main__":
    sys.exit(main())
