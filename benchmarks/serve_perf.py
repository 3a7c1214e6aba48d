"""perf_analyzer throughput and latency of the served default embedding model.

Starts tritonserver on loopback with the default repository (``hps prepare``), writes a Zipf
(alpha 1.05) perf_analyzer input with 26 keys per table per request, and measures each
protocol at each concurrency. Prints a table; writes ``serve_perf.csv`` and the raw
perf_analyzer output to ``--out``.

Usage:
    python benchmarks/serve_perf.py                        # gRPC and HTTP, concurrency 1 and 8
    python benchmarks/serve_perf.py --concurrency 1,4,16 --window-ms 10000
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from hps_core.cli.main import main as hps_main
from hps_core.server.perf import run_perf_analyzer
from hps_core.server.process import TritonServer

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    with tempfile.TemporaryDirectory(prefix="hps-serve-perf-") as tmp:
        repo = Path(tmp) / "repo"
        hps_main(["prepare", str(repo)])
        inputs = Path(tmp) / "perf_input.json"
        subprocess.run(
            [sys.executable, str(ROOT / "client_examples" / "make_perf_input.py"),
             "--keys-per-table", args.keys_per_table, "--alpha", str(args.alpha),
             "--samples", "256", "--out", str(inputs)],
            check=True, capture_output=True,
        )  # fmt: skip
        with TritonServer(repo) as server:
            for protocol in args.protocols.split(","):
                url = getattr(server, f"{protocol}_url").split("//")[-1]
                found, log = run_perf_analyzer(
                    "hps_embedding", url, protocol, inputs, levels,
                    measurement_ms=args.window_ms, stability_percent=args.stability,
                )  # fmt: skip
                results += found
                logs.append(log)
    print(
        f"host: {platform.node()} ({os.cpu_count()} cores, no GPU); model hps_embedding "
        f"(2 CPU instances, dynamic batching); {args.keys_per_table} keys per table per "
        f"request, Zipf alpha {args.alpha}; window {args.window_ms} ms, stability {args.stability}%"
    )
    print(f"{'protocol':>8} {'conc':>5} {'infer/s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}")
    for r in results:
        print(
            f"{r.protocol:>8} {r.concurrency:>5} {r.throughput:>9.1f} {r.p50_us / 1e3:>8.2f} "
            f"{r.p90_us / 1e3:>8.2f} {r.p99_us / 1e3:>8.2f}"
        )
    with (out / "serve_perf.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[x.name for x in dataclasses.fields(results[0])])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(r) for r in results)
    (out / "serve_perf.log").write_text("\n".join(logs))
    print(f"wrote {out / 'serve_perf.csv'}")


if __name__ == "__main__":
    main()
