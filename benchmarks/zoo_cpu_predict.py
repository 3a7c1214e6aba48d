"""The zoo on the CPU: ``RankingSession.predict`` of every ``hps prepare --zoo`` family on the
NumPy path, multi-hot tables pooled from their distinct keys' rows against a row per key.

Each family is written to a temporary folder (random weights, its tables' rows), and batches
of random known keys (each table's fixed hotness) are scored on the NumPy path, alternating
two ways of pooling the fixed-hotness tables: from the distinct keys' rows
(``ModelLookup.lookup_rows_many``, the default) and from a row per key (what ``lookup_many``
returns: a copy of each key's row, then a sum). Both give the same scores (checked). Prints
the medians and writes ``zoo_cpu_predict.csv`` to ``--out``.

Usage:
    python benchmarks/zoo_cpu_predict.py --batches 64,1024 --out /tmp/zoo_cpu
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from result_table import write_results
from zoo_batches import random_batch

from hps_core.demo import ZOO_MODELS
from hps_core.hps import HPS
from hps_core.infer import RankingSession
from hps_core.lookup.model_lookup import ModelLookup
from hps_core.triton_repo import InstanceGroup, ServingOptions

DISTINCT = ModelLookup.lookup_rows_many


def row_per_key(self: ModelLookup, table_ids, keys):
    """``lookup_rows_many`` as a row per key: ``lookup_many``'s rows, no index."""
    return [(rows, None) for rows in self.lookup_many(table_ids, keys)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1024")
    parser.add_argument("--models", default=",".join(ZOO_MODELS))
    parser.add_argument("--rounds", type=int, default=5, help="rounds alternating the two")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    options = ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_CPU"),))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name in args.models.split(","):
            ZOO_MODELS[name](root, options)
            session = RankingSession.open(root / name / "ps.json", name)
            rng = np.random.default_rng(0)
            for batch in (int(b) for b in args.batches.split(",")):
                batches = [random_batch(session, rng, batch) for _ in range(3)]
                times: dict[str, list[float]] = {"distinct": [], "row_per_key": []}
                scores = {}
                for _ in range(args.rounds):
                    for way, lookup in (("distinct", DISTINCT), ("row_per_key", row_per_key)):
                        ModelLookup.lookup_rows_many = lookup
                        session.predict(batches[0])  # warm
                        for sparse in batches:
                            started = time.perf_counter()
                            scores[way] = session.predict(sparse)
                            times[way].append(time.perf_counter() - started)
                ModelLookup.lookup_rows_many = DISTINCT
                np.testing.assert_array_equal(scores["distinct"], scores["row_per_key"])
                ms = {way: 1e3 * statistics.median(t) for way, t in times.items()}
                rows.append({
                    "model": name, "batch": batch,
                    "hotness": "/".join(str(h) for h in sorted(set(session.layout.hotness))),
                    "distinct_ms": ms["distinct"], "row_per_key_ms": ms["row_per_key"],
                    "samples_per_s": batch / ms["distinct"] * 1e3,
                    "speedup": ms["row_per_key"] / ms["distinct"],
                })  # fmt: skip
            HPS.close_all()
    print(f"medians of {3 * args.rounds} predictions each, the two ways alternating")
    write_results(args.out / "zoo_cpu_predict.csv", list(rows[0]), rows)


if __name__ == "__main__":
    main()
