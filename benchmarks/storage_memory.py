"""Memory of a model in each storage precision: host RAM and GPU memory against its FP32 bytes.

For each ``--storage`` precision and ``--caches`` setting, a fresh process opens the model's
GPU ranking session (``RankingSession.open(ps, name, device_id=0)``: the shared host tier
built in ``/dev/shm`` from the sparse files, the GPU caches or static tables, the GPU copy of
the host tier's row index) and scores one batch, then reports:

- ``shm_bytes``: the host tier's segments (``/dev/shm``), the bytes of every table's segment;
- ``private_rss_bytes``: the growth of the process's private resident memory (RSS less its
  shared pages, so that the segment is not counted twice) from just before the model opened,
  after a small demo model was opened and scored in the same process (so that what any model
  costs once per process, CUDA libraries, cuBLAS handles, compiled kernels, is not counted);
- ``host_bytes``: their sum, the host RAM the model takes;
- ``gpu_bytes``: the growth of the GPU's used memory (``cudaMemGetInfo``) over the same span;
- ``footprint_host`` / ``footprint_gpu``: what ``hps check`` predicts for the same tiers;
- ratios of each to the model's FP32 bytes (rows x dim x 4 of its sparse files), and the rows
  a GPU cache of the FP32 cache's bytes holds, relative to FP32 (slots with their key and
  stamp, and rows alone).

Writes ``storage_memory.csv`` under ``--out`` and prints a table.

Usage:
    python benchmarks/make_large_dlrm.py --out /tmp/dlrm --max-rows-per-table 1000000
    python benchmarks/storage_memory.py --ps-json /tmp/dlrm/ps.json --out $OUT
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from ps_variant import ps_variant
from result_table import write_results

from hps_core.cache.layout import WAYS, slot_bytes
from hps_core.config import ModelConfig, load_ps_config
from hps_core.infer import SparseBatch
from hps_core.quant import RowFormat, StoragePrecision

COLUMNS = [
    "storage", "cache", "fp32_bytes", "shm_bytes", "private_rss_bytes", "host_bytes",
    "host_x_fp32", "footprint_host", "gpu_bytes", "gpu_x_fp32", "footprint_gpu",
    "cache_rows_x_fp32_slots", "cache_rows_x_fp32_rows", "build_s",
]  # fmt: skip


def score_once(session: object, model: ModelConfig) -> None:
    rng = np.random.default_rng(0)
    keys = [
        rng.integers(0, 1000, (64, t.max_query_per_sample), dtype=np.int64) for t in model.tables
    ]
    dense = rng.standard_normal((64, model.maxnum_des_feature_per_sample)).astype(np.float32)
    session.predict(SparseBatch(dense, tuple(k.reshape(-1) for k in keys), (None,) * len(keys)))


def measure_one(ps_json: Path) -> dict[str, float]:
    """Open the model in this (fresh) process and measure what it took."""
    import tempfile
    import time

    import cupy
    import psutil

    from hps_core.demo import DEMO_MODELS
    from hps_core.footprint import model_footprint
    from hps_core.hps import HPS
    from hps_core.infer import RankingSession
    from hps_core.triton_repo import ServingOptions

    config = load_ps_config(ps_json)
    model = config.models[0]
    process = psutil.Process()
    cupy.cuda.Device(0).use()
    # What every process pays once (CUDA context, libraries, kernels), before the baseline.
    with tempfile.TemporaryDirectory() as tmp:
        DEMO_MODELS["dlrm"](Path(tmp), ServingOptions())
        demo_ps = Path(tmp) / "dlrm" / "ps.json"
        demo = RankingSession.open(demo_ps, "dlrm", device_id=0)
        score_once(demo, load_ps_config(demo_ps).models[0])
        cupy.cuda.Device(0).synchronize()
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    info = process.memory_info()
    private_before = info.rss - info.shared
    started = time.perf_counter()
    session = RankingSession.open(ps_json, model.name, device_id=0)
    score_once(session, model)  # every table opens (the host tiers are built) here
    cupy.cuda.Device(0).synchronize()
    build_s = time.perf_counter() - started
    info = process.memory_info()
    private = info.rss - info.shared - private_before
    gpu = free_before - cupy.cuda.runtime.memGetInfo()[0]
    shm = sum(session.lookup.table(t).host.nbytes for t in range(len(model.tables)))
    footprint = model_footprint(config, model)
    per_gpu = footprint.tier_bytes()
    HPS.close_all()  # the last user of each segment removes it from /dev/shm
    return {
        "shm_bytes": shm,
        "private_rss_bytes": private,
        "gpu_bytes": gpu,
        "footprint_host": per_gpu.get("host", 0),
        "footprint_gpu": sum(per_gpu.get(k, 0) for k in ("gpu_cache", "gpu_static", "gpu_index")),
        "build_s": build_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps-json", type=Path, required=True)
    parser.add_argument("--storage", default="fp32,fp16,int8,fp8")
    parser.add_argument("--caches", default="0.2,static")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child's ps.json
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure_one(args.one)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    model = load_ps_config(args.ps_json).models[0]
    rows = [(t.sparse_file / "key").stat().st_size // 8 for t in model.tables]
    fp32_bytes = sum(n * t.dim * 4 for n, t in zip(rows, model.tables, strict=True))
    print(f"model {model.name}: {len(rows)} tables, {sum(rows):,} rows, FP32 rows "
          f"{fp32_bytes / 2**30:.2f} GiB")  # fmt: skip
    results = []
    for storage in args.storage.split(","):
        precision = StoragePrecision.parse(storage)
        # Rows a cache of the FP32 cache's bytes holds, relative to FP32 (dim of table 0).
        dim = model.tables[0].dim
        fp32_slot = slot_bytes(1, dim).nbytes / WAYS
        slot = slot_bytes(1, dim, precision).nbytes / WAYS
        row = RowFormat(precision, dim).row_bytes
        for cache in args.caches.split(","):
            ps = ps_variant(args.ps_json, cache, storage, tag="memory")
            child = subprocess.run(
                [sys.executable, __file__, "--ps-json", str(args.ps_json), "--one", str(ps)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if child.returncode != 0:
                print(child.stderr[-3000:])
                raise SystemExit(f"{storage} {cache}: the measuring process failed")
            got = json.loads(child.stdout.strip().splitlines()[-1])
            host = got["shm_bytes"] + got["private_rss_bytes"]
            result = {
                "storage": storage, "cache": cache, "fp32_bytes": fp32_bytes, **got,
                "host_bytes": host, "host_x_fp32": host / fp32_bytes,
                "gpu_x_fp32": got["gpu_bytes"] / fp32_bytes,
                "cache_rows_x_fp32_slots": fp32_slot / slot,
                "cache_rows_x_fp32_rows": 4 * dim / row,
            }  # fmt: skip
            results.append(result)
            print(f"{storage:>5} {cache:>6}: host {host / 2**30:.2f} GiB ({host / fp32_bytes:.3f}x "
                  f"FP32; shm {got['shm_bytes'] / 2**30:.2f}, private RSS "
                  f"{got['private_rss_bytes'] / 2**20:.0f} MiB), GPU {got['gpu_bytes'] / 2**30:.2f}"
                  f" GiB (hps check: host {got['footprint_host'] / 2**30:.2f}, GPU "
                  f"{got['footprint_gpu'] / 2**30:.2f}), built in {got['build_s']:.1f} s",
                  flush=True)  # fmt: skip
    write_results(args.out / "storage_memory.csv", COLUMNS, results)


if __name__ == "__main__":
    main()
