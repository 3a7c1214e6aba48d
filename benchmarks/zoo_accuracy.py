"""Accuracy of the zoo models (``hps prepare --zoo``) in FP32, TF32 and FP16 against float64.

For each model: its files as ``hps prepare --zoo`` writes them, random pooled embeddings and
dense features (BST's first dense feature, the sequence length, 0 to 6), ``--batch`` samples;
the dense network in each precision (NumPy; also CuPy when a GPU is there) against the float64
reference of the tests (``tests/unit/nn/nn_reference.py``, written from HugeCTR's definitions).
Prints max absolute and relative L2 error of the predictions; writes ``zoo_accuracy.csv``.

Usage:
    python benchmarks/zoo_accuracy.py --out bench_results
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import numpy as np

from hps_core.config import load_ps_config
from hps_core.demo import ZOO_MODELS
from hps_core.infer import load_ranking_graph
from hps_core.nn import DenseExecutor, read_dense_blob

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit" / "nn"))
from nn_reference import network_forward


def backends() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = [("NumPy", np)]
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            found.append(("CuPy", cupy))
    except Exception:  # no CuPy or no device: NumPy only
        pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hps-zoo-") as tmp:
        for name, write in ZOO_MODELS.items():
            write(Path(tmp))
            model = load_ps_config(Path(tmp) / name / "ps.json").model(name)
            graph, _ = load_ranking_graph(model)
            params = read_dense_blob(model.dense_file, graph.dense_layout())
            rng = np.random.default_rng(args.seed)
            dense = rng.random((args.batch, graph.spec.data.dense_dim), dtype=np.float32)
            if name == "bst":
                dense[:, 0] = rng.integers(0, 7, args.batch)
            pooled = {
                node.spec.name: (0.5 * rng.standard_normal(
                    (args.batch, node.layer.slot_num, node.layer.vec_size))).astype(np.float32)
                for node in graph.embeddings
            }  # fmt: skip
            flat = np.fromfile(model.dense_file, dtype="<f4")
            want = network_forward(model.network_file, flat, dense.astype(np.float64), pooled)
            for label, xp in backends():
                for precision in ("fp32", "tf32", "fp16"):
                    executor = DenseExecutor(graph, params, xp, precision)
                    got = executor.forward(
                        xp.asarray(dense), {k: xp.asarray(v) for k, v in pooled.items()}
                    )
                    got = got.get() if hasattr(got, "get") else got
                    diff = got.astype(np.float64) - want
                    rows.append(dict(
                        model=name, backend=label, precision=precision, batch=args.batch,
                        max_abs=float(np.abs(diff).max()),
                        rel_l2=float(np.linalg.norm(diff) / np.linalg.norm(want)),
                    ))  # fmt: skip
    print("| model | backend | precision | max abs error | relative L2 error |")
    print("| --- | --- | --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['backend']} | {r['precision'].upper()} | "
              f"{r['max_abs']:.1e} | {r['rel_l2']:.1e} |")  # fmt: skip
    with open(args.out / "zoo_accuracy.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
