"""The zoo on the CPU: ``RankingSession.predict`` of every ``hps prepare --zoo`` family (and,
with ``--models``, the demo models) on the NumPy path, under four ways of looking up and
pooling its tables.

Each family is written to a temporary folder (random weights, its tables' rows), and batches
of random known keys (each table's fixed hotness) are scored on the NumPy path, the ways
alternating in rounds:

- ``arrow``: the default: distinct keys found by pyarrow's hash table
  (``hps_core.arrays.distinct_keys``), multi-hot tables pooled from the distinct keys' rows
  (``ModelLookup.lookup_rows_many``);
- ``np_unique``: the same with ``np.unique`` (a sort) finding the distinct keys;
- ``row_per_key``: ``np.unique``, and a row copied out per key before the sums (as
  ``lookup_many`` returns them);
- ``one_by_one``: the default, except that the tables of a few keys each (at most
  ``SEARCH_KEYS``) are looked up one after the other instead of together
  (``table_lookup.lookup_together``: one hashing of every table's keys, one count of their
  distinct keys).

All give the same scores (checked). Prints the medians and writes ``zoo_cpu_predict.csv`` to
``--out``.

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

from hps_core.demo import DEMO_MODELS, ZOO_MODELS
from hps_core.host_memory import keep_freed_memory
from hps_core.hps import HPS
from hps_core.infer import RankingSession
from hps_core.lookup import model_lookup, table_lookup
from hps_core.lookup.model_lookup import ModelLookup
from hps_core.triton_repo import InstanceGroup, ServingOptions

DISTINCT = ModelLookup.lookup_rows_many
ARROW = table_lookup.distinct_keys


def row_per_key(self: ModelLookup, table_ids, keys):
    """``lookup_rows_many`` as a row per key: ``lookup_many``'s rows, no index."""
    return [(rows, None) for rows in self.lookup_many(table_ids, keys)]


def sorted_distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.unique(keys, return_inverse=True)


TOGETHER = model_lookup.together_positions


def never_together(lookups, keys) -> list[int]:
    return []


WAYS = {  # lookup_rows_many, distinct_keys, together_positions
    "arrow": (DISTINCT, ARROW, TOGETHER),
    "np_unique": (DISTINCT, sorted_distinct, TOGETHER),
    "row_per_key": (row_per_key, sorted_distinct, TOGETHER),
    "one_by_one": (DISTINCT, ARROW, never_together),
}
MODELS = {**ZOO_MODELS, **DEMO_MODELS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1024")
    parser.add_argument("--models", default=",".join(ZOO_MODELS), help=f"of {sorted(MODELS)}")
    parser.add_argument("--rounds", type=int, default=5, help="rounds alternating the ways")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    keep_freed_memory()  # as a served instance's process does (cpu_batch_memory.py)
    options = ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_CPU"),))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name in args.models.split(","):
            MODELS[name](root, options)
            session = RankingSession.open(root / name / "ps.json", name)
            rng = np.random.default_rng(0)
            for batch in (int(b) for b in args.batches.split(",")):
                batches = [random_batch(session, rng, batch) for _ in range(3)]
                times: dict[str, list[float]] = {way: [] for way in WAYS}
                scores = {}
                for _ in range(args.rounds):
                    for way, (lookup, distinct, together) in WAYS.items():
                        ModelLookup.lookup_rows_many = lookup
                        table_lookup.distinct_keys = distinct
                        model_lookup.together_positions = together
                        session.predict(batches[0])  # warm
                        for sparse in batches:
                            started = time.perf_counter()
                            scores[way] = session.predict(sparse)
                            times[way].append(time.perf_counter() - started)
                ModelLookup.lookup_rows_many, table_lookup.distinct_keys = DISTINCT, ARROW
                model_lookup.together_positions = TOGETHER
                for way in WAYS:
                    np.testing.assert_array_equal(scores[way], scores["arrow"])
                ms = {way: 1e3 * statistics.median(t) for way, t in times.items()}
                rows.append({
                    "model": name, "batch": batch,
                    "hotness": "/".join(str(h) for h in sorted(set(session.layout.hotness))),
                    **{f"{way}_ms": ms[way] for way in WAYS},
                    "samples_per_s": batch / ms["arrow"] * 1e3,
                    "x_np_unique": ms["np_unique"] / ms["arrow"],
                    "x_row_per_key": ms["row_per_key"] / ms["arrow"],
                    "x_one_by_one": ms["one_by_one"] / ms["arrow"],
                })  # fmt: skip
            HPS.close_all()
    print(f"medians of {3 * args.rounds} predictions each, the ways alternating")
    write_results(args.out / "zoo_cpu_predict.csv", list(rows[0]), rows)


if __name__ == "__main__":
    main()
