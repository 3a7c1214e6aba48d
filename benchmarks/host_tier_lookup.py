"""Host-tier lookup throughput against plain Python dict baselines, measured in one run.

For each table shape it writes a HugeCTR sparse folder, builds the shared-memory table, and
times looking up the same random keys (all present) with:

- ``shared``: :class:`hps_core.tiers.host_table.SharedHostTable` (vectorised hash lookup +
  gather into a new [n, dim] array);
- ``shared+out``: the same, gathering into a reused output array, as a server does;
- ``dict-vector``: a dict key -> row vector, ``np.stack([d[k] for k in keys])``;
- ``dict-index``: a dict key -> row number, then one NumPy gather (a stronger baseline);
- ``shared-<precision>`` for each of ``--storage`` (``fp16``, ``int8``, ``fp8``): the shared
  table stored compressed, gathering and decoding into a reused output array (checked equal to
  the FP32 rows quantised once).

Each method runs ``--repeats`` times; the table reports the median. Also reported: the shared
table's size against the sparse files' size, and its build time.

Usage:
    python benchmarks/host_tier_lookup.py                      # 10M x 16 and 2M x 128, 1M keys
    python benchmarks/host_tier_lookup.py --tables 100000x16 --keys 10000 --repeats 3
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hps_core.formats.sparse_writer import SparseTableWriter
from hps_core.quant import RowFormat
from hps_core.tiers.host_table import SharedHostTable


def _write_table(folder: Path, rows: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    # Sparse keys spread over the int64 range, like hashed categorical ids.
    keys = np.unique(rng.integers(-(2**62), 2**62, int(rows * 1.01), dtype=np.int64))
    keys = rng.permutation(keys)[:rows]
    chunk = 1_000_000
    with SparseTableWriter(folder) as writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            writer.append(keys[start : start + n], rng.standard_normal((n, dim), np.float32))
        writer.commit()
    return keys


def _time(fn: Callable[[], np.ndarray], repeats: int) -> tuple[list[float], np.ndarray]:
    fn()  # warm-up: first touches of the output and of the table's pages are not timed
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    assert out is not None
    return times, out


def _dict_baselines(
    keys: np.ndarray, table: SharedHostTable, queries: np.ndarray, repeats: int
) -> tuple[list[tuple[str, list[float]]], list[np.ndarray]]:
    vectors = table._values  # the shared rows: the baselines need no second copy
    rows_of = {int(k): r for k, r in zip(keys.tolist(), table.find(keys).tolist(), strict=True)}
    by_vector = {k: vectors[r] for k, r in rows_of.items()}
    vec_times, vec_out = _time(lambda: np.stack([by_vector[k] for k in queries.tolist()]), repeats)
    n = len(queries)
    idx_times, idx_out = _time(
        lambda: vectors[np.fromiter((rows_of[k] for k in queries.tolist()), np.int64, n)],
        repeats,
    )
    return [("dict-vector", vec_times), ("dict-index", idx_times)], [vec_out, idx_out]


def bench_table(
    rows: int,
    dim: int,
    num_keys: int,
    repeats: int,
    workdir: Path,
    rng: np.random.Generator,
    storages: tuple[str, ...] = (),
) -> list[dict[str, object]]:
    """Measure one table shape; returns one result row per method."""
    folder = workdir / f"table_{rows}x{dim}"
    keys = _write_table(folder, rows, dim, rng)
    file_bytes = (folder / "key").stat().st_size + (folder / "emb_vector").stat().st_size
    start = time.perf_counter()
    table = SharedHostTable(folder, dim)
    build_s = time.perf_counter() - start
    queries = keys[rng.integers(0, rows, num_keys)]

    results = []
    shared_times, shared_out = _time(lambda: table.lookup(queries)[0], repeats)
    results.append(("shared", shared_times))
    # A server reuses its output buffer between batches: no page faults on fresh memory.
    buffer = np.empty((num_keys, dim), np.float32)
    reuse_times, reuse_out = _time(lambda: table.lookup(queries, out=buffer)[0], repeats)
    results.append(("shared+out", reuse_times))

    baselines, outputs = _dict_baselines(keys, table, queries, repeats)
    results += baselines
    # Every method must return the same vectors, or the timing means nothing.
    for out in (reuse_out, *outputs):
        np.testing.assert_array_equal(shared_out, out)
    sizes = {name: table.nbytes for name, _ in results}
    for storage in storages:
        fmt = RowFormat(storage, dim)
        compressed = SharedHostTable(folder, dim, precision=storage)
        times, got = _time(lambda t=compressed: t.lookup(queries, out=buffer)[0], repeats)
        np.testing.assert_array_equal(got, fmt.decode_stored(fmt.encode_stored(shared_out)))
        results.append((f"shared-{storage}", times))
        sizes[f"shared-{storage}"] = compressed.nbytes
        compressed.close()

    medians = {name: statistics.median(t) for name, t in results}
    out_bytes = num_keys * dim * 4
    rows_out = []
    for name, times in results:
        med = medians[name]
        rows_out.append(
            {
                "table": f"{rows}x{dim}",
                "method": name,
                "keys": num_keys,
                "repeats": repeats,
                "median_s": round(med, 5),
                "min_s": round(min(times), 5),
                "mkeys_per_s": round(num_keys / med / 1e6, 2),
                "gb_per_s": round(out_bytes / med / 1e9, 3),
                "speedup_vs_dict_vector": round(medians["dict-vector"] / med, 1),
                "speedup_vs_dict_index": round(medians["dict-index"] / med, 1),
                "shared_bytes_over_file_bytes": round(sizes[name] / file_bytes, 3),
                "build_s": round(build_s, 2),
            }
        )
    table.close()
    return rows_out


def _print(rows: list[dict[str, object]]) -> None:
    cols = [
        ("table", 11), ("method", 11), ("median_s", 9), ("mkeys_per_s", 11), ("gb_per_s", 8),
        ("speedup_vs_dict_vector", 9), ("speedup_vs_dict_index", 9),
        ("shared_bytes_over_file_bytes", 9), ("build_s", 7),
    ]  # fmt: skip
    heads = ["table", "method", "median s", "Mkeys/s", "GB/s", "x dictvec", "x dictidx",
             "mem/file", "build s"]  # fmt: skip
    print("  ".join(h.rjust(w) for h, (_, w) in zip(heads, cols, strict=True)))
    for row in rows:
        print("  ".join(str(row[c]).rjust(w) for c, w in cols))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="10000000x16,2000000x128", help="ROWSxDIM,...")
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys per lookup")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench_results", help="folder for the CSV and plot")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--storage", default="fp16,int8,fp8", help="compressed precisions to time too ('' none)"
    )
    args = parser.parse_args()
    storages = tuple(s for s in args.storage.split(",") if s)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="hps-bench-") as tmp:
        os.environ["HPS_SHM_DIR"] = str(Path(tmp) / "shm")  # keep /dev/shm out of it
        for spec in args.tables.split(","):
            rows, dim = (int(x) for x in spec.lower().split("x"))
            results += bench_table(rows, dim, args.keys, args.repeats, Path(tmp), rng, storages)
    print(
        f"host: {platform.node()} ({os.cpu_count()} cores), numpy {np.__version__}, "
        f"{args.keys} random keys per lookup (all present), median of {args.repeats}"
    )
    _print(results)
    with (out / "host_tier_lookup.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    _plot(results, out / "host_tier_lookup.png")
    print(f"wrote {out / 'host_tier_lookup.csv'} and {out / 'host_tier_lookup.png'}")


def _plot(results: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = sorted({str(r["table"]) for r in results}, key=str)
    methods = list(dict.fromkeys(str(r["method"]) for r in results))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        values = [
            next(
                float(r["mkeys_per_s"])
                for r in results
                if r["table"] == t and r["method"] == method
            )
            for t in tables
        ]
        ax.bar(np.arange(len(tables)) + i * width, values, width, label=method)
    ax.set_xticks(np.arange(len(tables)) + (len(methods) - 1) / 2 * width, tables)
    ax.set_ylabel("million keys / s")
    ax.set_title("host-tier lookup, 1 thread")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
