"""Offline scoring of a Parquet dataset: ``InferenceModel.predict_dataset`` rows per second.

Writes a labelled dataset in HugeCTR's column order (``label``, ``I1..``, ``C1..``; one-hot
Zipf(``--alpha``) keys over each table's rows, uniform dense features) for a ps.json ranking
model, then per device (``cpu`` and/or GPU ids) scores it ``--runs`` times and reports the
median rows/s of the whole call (reading, lookup, dense network), beside the rows/s of reading
the same batches alone (``iter_dataset``: what the Parquet side costs). The first call of each
device is a warm-up (tables loaded into the host tier, caches and graphs filled).

Usage:
    python benchmarks/offline_predict.py --ps-json model_repository/dlrm/ps.json --out $OUT
    python benchmarks/offline_predict.py --ps-json /tmp/dlrm/ps.json --devices cpu,0 --rows 1000000
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hps_core.config import load_ps_config
from hps_core.host_memory import keep_freed_memory
from hps_core.offline import InferenceModel, dataset_columns, dataset_files, iter_dataset
from hps_core.workload import zipf_keys


def write_dataset(path: Path, model: InferenceModel, ps_json: Path, rows: int, alpha: float):
    layout = model.layout
    config = load_ps_config(ps_json).model(layout.model)
    table_rows = [(t.sparse_file / "key").stat().st_size // 8 for t in config.tables]
    rng = np.random.default_rng(0)
    columns, names = [pa.array((rng.random(rows) < 0.3).astype(np.float32))], ["label"]
    for j in range(layout.dense_dim):
        columns.append(pa.array(rng.random(rows, dtype=np.float32)))
        names.append(f"I{j + 1}")
    slot = 0
    for t, slots in enumerate(layout.slot_nums):
        file_keys = np.fromfile(config.tables[t].sparse_file / "key", dtype=np.int64)
        for _ in range(slots):
            picks = zipf_keys(rng, rows, table_rows[t], alpha, permutation_seed=slot)
            columns.append(pa.array(file_keys[picks % len(file_keys)]))
            slot += 1
            names.append(f"C{slot}")
    pq.write_table(pa.Table.from_arrays(columns, names=names), path, row_group_size=65536)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps-json", type=Path, required=True)
    parser.add_argument("--model", help="the ps.json model (default: its only one)")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--devices", default="cpu", help="cpu and/or GPU ids, e.g. cpu,0")
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    keep_freed_memory()  # as `hps predict` does
    data = args.out / "offline_dataset.parquet"
    results = []
    for device in args.devices.split(","):
        device_id = None if device == "cpu" else int(device)
        model = InferenceModel.from_ps_json(args.ps_json, args.model, device_id)
        if not data.exists():
            write_dataset(data, model, args.ps_json, args.rows, args.alpha)
        files = dataset_files(data)
        columns = dataset_columns(files, model.layout, data)
        batch = model.layout.max_batch_size
        read = []
        for _ in range(args.runs):
            started = time.perf_counter()
            for _ in iter_dataset(files, columns, model.layout, batch):
                pass
            read.append(time.perf_counter() - started)
        model.predict_dataset(data, progress=False)  # warm-up
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            result = model.predict_dataset(data, progress=False)
            times.append(time.perf_counter() - started)
        rows = result.scores.shape[0]
        row = {
            "device": device,
            "model": model.layout.model,
            "rows": rows,
            "batch": batch,
            "rows_per_s": rows / statistics.median(times),
            "read_only_rows_per_s": rows / statistics.median(read),
            "auc": result.auc(),
        }
        results.append(row)
        print(
            f"{device}: {row['rows_per_s']:,.0f} rows/s scored ({row['read_only_rows_per_s']:,.0f}"
            f" rows/s reading alone), {rows:,} rows in batches of {batch}, AUC {row['auc']:.4f}",
            flush=True,
        )
        model.close()
    with open(args.out / "offline_predict.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    print("\n| device | model | rows | batch | rows/s | reading alone rows/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['device']} | {r['model']} | {r['rows']:,} | {r['batch']:,} | "
              f"{r['rows_per_s']:,.0f} | {r['read_only_rows_per_s']:,.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
