"""Loading a table into the shared host tier from S3 against the same files on local disk.

Writes one sparse table (``--rows`` x ``--dim``), uploads it to an S3-compatible server started
here on a loopback port (moto's server mode: an in-memory S3, so this measures the engine's
path through ``pyarrow.fs`` and HTTP, not a real network or real S3's throughput), then builds
the host tier from each source ``--runs`` times (a fresh ``HPS_SHM_DIR`` every time, so every
run reads and hashes the whole table) and prints the median seconds and MB/s of each. The local
files are read from the page cache after the first run.

Usage:
    python benchmarks/s3_load.py --rows 1000000 --dim 32 --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    from hps_core.formats.sparse_writer import write_sparse_table
    from hps_core.formats.uris import open_uri
    from hps_core.tiers.host_table import SharedHostTable

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "table"
        rng = np.random.default_rng(0)
        keys = rng.permutation(args.rows * 4)[: args.rows].astype(np.int64)
        write_sparse_table(local, keys, rng.random((args.rows, args.dim), dtype=np.float32))
        s3 = fs.S3FileSystem(allow_bucket_creation=True, endpoint_override=f"http://{host}:{port}")
        s3.create_dir("bench")
        for name in ("key", "emb_vector"):
            with s3.open_output_stream(f"bench/table/{name}") as out:
                out.write((local / name).read_bytes())
        mb = (local / "key").stat().st_size / 1e6 + (local / "emb_vector").stat().st_size / 1e6
        for label, source in (("local disk", local), ("S3 (moto, loopback)", "s3://bench/table")):
            times = []
            for run in range(args.runs):
                os.environ["HPS_SHM_DIR"] = tempfile.mkdtemp(dir=tmp, prefix=f"shm{run}_")
                target = open_uri(source) if isinstance(source, str) else source
                started = time.perf_counter()
                table = SharedHostTable(target, args.dim)
                times.append(time.perf_counter() - started)
                table.close()
            seconds = statistics.median(times)
            rows.append({"source": label, "rows": args.rows, "dim": args.dim, "mb": mb,
                         "seconds": seconds, "mb_per_s": mb / seconds})  # fmt: skip
            print(f"{label}: {seconds:.2f} s ({mb / seconds:,.0f} MB/s) for {mb:,.0f} MB")
    server.stop()
    with open(args.out / "s3_load.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
