"""The zoo on the CPU with glibc's default heap and with ``keep_freed_memory``, one model per
process as Triton runs an instance.

Every ``hps prepare --zoo`` family (``--models``) is written to a temporary folder and scored on
the NumPy path (``RankingSession.predict``) in a child process of its own, once with
``HPS_MALLOC_TUNING=off`` (glibc's defaults: the heap gives its top back between batches) and
once with :func:`hps_core.host_memory.keep_freed_memory` in effect, the two alternating in
``--rounds`` rounds. Each child times ``--runs`` fresh batches of random known keys per batch
size after 5 warm-up batches, counts the minor page faults (``getrusage``) they took and reads
the process's resident memory after them (what the kept heap costs).
Prints the medians over rounds and writes ``cpu_batch_memory.csv`` under ``--out``.

Usage:
    python benchmarks/cpu_batch_memory.py --batches 64,1024 --rounds 3 --out /tmp/cpu_memory
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from result_table import write_results
from zoo_batches import random_batch

from hps_core.demo import ZOO_MODELS
from hps_core.host_memory import keep_freed_memory
from hps_core.hps import HPS
from hps_core.infer import RankingSession
from hps_core.triton_repo import InstanceGroup, ServingOptions

SETTINGS = {"glibc default": "off", "keep_freed_memory": "on"}
"""Each setting's ``HPS_MALLOC_TUNING``."""


def child(model: str, batches: list[int], runs: int) -> dict:
    """Time one model in this process: per batch size, the median ms of ``runs`` fresh
    batches, their minor page faults per batch and the process's resident MiB after them."""
    applied = keep_freed_memory()  # as the Triton models' initialize calls it
    repo = Path(tempfile.mkdtemp(prefix="cpu_memory_"))
    ZOO_MODELS[model](repo, ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_CPU"),)))
    ps = repo / model / "ps.json"
    session = RankingSession.open(ps, model)
    rng = np.random.default_rng(0)
    result = {"applied": applied}
    for batch in batches:
        fresh = [random_batch(session, rng, batch) for _ in range(runs + 5)]
        for sparse in fresh[:5]:
            session.predict(sparse)
        times = []
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for sparse in fresh[5:]:
            started = time.perf_counter()
            session.predict(sparse)
            times.append(time.perf_counter() - started)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        rss = psutil.Process().memory_info().rss / 2**20
        result[str(batch)] = (1e3 * statistics.median(times), faults / runs, rss)
    HPS(ps).close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO_MODELS))
    parser.add_argument("--batches", default="64,1024")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        print(json.dumps(child(args.child, batches, args.runs)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    models = args.models.split(",")
    seen: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for round_ in range(args.rounds):
        for model in models:
            for setting, tuning in SETTINGS.items():
                command = [sys.executable, __file__, "--child", model, "--batches", args.batches,
                           "--runs", str(args.runs)]  # fmt: skip
                env = {**os.environ, "HPS_MALLOC_TUNING": tuning}
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                if result["applied"] != (tuning == "on"):
                    raise SystemExit(f"{model}: keep_freed_memory() gave {result['applied']}")
                for batch in batches:
                    seen.setdefault((model, setting, batch), []).append(tuple(result[str(batch)]))
        print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    rows = []
    default, kept = SETTINGS
    for model in models:
        for batch in batches:
            row = {"model": model, "batch": batch, "rounds": args.rounds}
            for setting, key in ((default, "default"), (kept, "kept")):
                runs = seen[(model, setting, batch)]
                row[f"{key}_ms"] = statistics.median(ms for ms, _, _ in runs)
                row[f"{key}_faults_per_batch"] = statistics.median(f for _, f, _ in runs)
                row[f"{key}_rss_mib"] = statistics.median(rss for _, _, rss in runs)
            row["speedup"] = row["default_ms"] / row["kept_ms"]
            rows.append(row)
    columns = ["model", "batch", "rounds", "default_ms", "kept_ms", "speedup",
               "default_faults_per_batch", "kept_faults_per_batch", "default_rss_mib",
               "kept_rss_mib"]  # fmt: skip
    write_results(args.out / "cpu_batch_memory.csv", columns, rows)


if __name__ == "__main__":
    main()
