"""Throughput of a ranking model served on one GPU and on several: the scaling factor.

Serves the ``hugectr``-contract model of ``--ps-json`` twice on fresh servers, same settings,
same run: with ``instance_group [{ count: N, kind: KIND_GPU, gpus: [0] }]``, then with
``gpus: [0, 1, ...]`` (``--gpus``), N instances on each GPU either way. The ps.json's
``deployed_device_list`` is set to the GPUs of each configuration, so that every instance has
its caches on its own GPU. perf_analyzer (gRPC) measures each concurrency; the metrics endpoint
shows what each GPU served (lookups and cache hit rate per ``device`` label) and nvidia-smi the
memory in use on each GPU.

Prints a table with the scaling factor (throughput on all GPUs over throughput on GPU 0, at each
concurrency); writes ``gpu_scaling.csv`` and the raw perf_analyzer output to ``--out``.

Usage:
    python benchmarks/make_large_dlrm.py --out /tmp/dlrm --max-rows-per-table 1000000
    python benchmarks/gpu_scaling.py --ps-json /tmp/dlrm/ps.json --gpus 0,1 --out results
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

from ranking_load import (
    add_load_arguments,
    gpu_memory_mib,
    hit_rate,
    metric_sums,
    write_input,
    write_model_repository,
)

from hps_core.server.perf import run_perf_analyzer
from hps_core.server.process import TritonServer
from hps_core.triton_repo import InstanceGroup, ServingOptions

_METRICS = ("hps_cache_hits_total", "hps_cache_misses_total", "hps_lookups_total")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_load_arguments(parser, concurrency="4,8,16")
    parser.add_argument("--gpus", default="0,1", help="the GPUs of the multi-GPU configuration")
    parser.add_argument("--instances-per-gpu", type=int, default=2)
    args = parser.parse_args()

    gpus = tuple(int(g) for g in args.gpus.split(","))
    visible = len(gpu_memory_mib())
    if max(gpus) >= visible:
        print(f"--gpus {args.gpus} needs GPU {max(gpus)}, nvidia-smi shows {visible} GPU(s)")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    levels = [int(c) for c in args.concurrency.split(",")]
    source = Path(args.ps_json).resolve()
    ps = json.loads(source.read_text())
    model = ps["models"][0]["model"]
    rows, logs = [], []
    with tempfile.TemporaryDirectory(prefix="hps-gpu-scaling-") as tmp:
        perf_input = Path(tmp) / "input.json"
        write_input(source, model, args.samples, args.alpha, perf_input)
        idle = gpu_memory_mib()
        for devices in ((gpus[0],), gpus):
            ps["models"][0].update(
                gpucache=True,
                gpucacheper=args.gpucacheper,
                hit_rate_threshold=0.9,
                deployed_device_list=list(devices),
            )
            # Beside the model files, whose paths are relative to it.
            ps_json = source.with_name(f"ps_scaling_{len(devices)}gpu.json")
            ps_json.write_text(json.dumps(ps, indent=1))
            repo = Path(tmp) / f"repo-{len(devices)}"
            group = InstanceGroup(args.instances_per_gpu, "KIND_GPU", devices)
            write_model_repository(ps_json, model, repo, ServingOptions(instances=(group,)))
            with TritonServer(repo, startup_timeout_s=900) as server:
                url = server.grpc_url.split("//")[-1]
                found, log = run_perf_analyzer(
                    model, url, "grpc", perf_input, levels,
                    measurement_ms=args.window_ms, stability_percent=args.stability,
                )  # fmt: skip
                logs.append(log)
                now = gpu_memory_mib()
                memory = [used - before for used, before in zip(now, idle, strict=True)]
                per_device = metric_sums(server.metrics_url, _METRICS, by="device")
            served = ", ".join(
                f"{d}: {int(s['hps_lookups_total'])} lookups, hit {hit_rate(s):.3f}, "
                f"{memory[int(d.removeprefix('gpu'))]} MiB"
                for d, s in sorted(per_device.items())
            )
            for r in found:
                rows.append(
                    {
                        "gpus": len(devices),
                        "instances": args.instances_per_gpu * len(devices),
                        "concurrency": r.concurrency,
                        "infer_per_s": r.throughput,
                        "samples_per_s": r.throughput * args.samples,
                        "p50_ms": r.p50_us / 1e3,
                        "p99_ms": r.p99_us / 1e3,
                        "per_device": served,
                    }
                )
    one = {r["concurrency"]: r["infer_per_s"] for r in rows if r["gpus"] == 1}
    for r in rows:
        r["scaling"] = r["infer_per_s"] / one[r["concurrency"]]
    print(
        f"{model}: {args.instances_per_gpu} KIND_GPU instances per GPU, {args.samples} samples "
        f"per request, Zipf {args.alpha}, gpucacheper {args.gpucacheper}, gRPC, window "
        f"{args.window_ms} ms, stability {args.stability}%"
    )
    print(f"{'GPUs':>4} {'conc':>4} {'samples/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'scaling':>7}")
    for r in rows:
        print(
            f"{r['gpus']:>4} {r['concurrency']:>4} {r['samples_per_s']:>10.0f} "
            f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['scaling']:>7.2f}"
        )
    for n in sorted({r["gpus"] for r in rows}):
        print(f"{n} GPU(s): {next(r['per_device'] for r in rows if r['gpus'] == n)}")
    with (out / "gpu_scaling.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "gpu_scaling.log").write_text("\n".join(logs))
    print(f"wrote {out / 'gpu_scaling.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
