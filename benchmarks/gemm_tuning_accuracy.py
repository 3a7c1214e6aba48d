"""Whether timing cuBLASLt's candidate algorithms changes TF32 accuracy, on zoo models.

Each ``--models`` family of ``hps prepare --zoo`` is scored on the GPU pipeline in TF32, and on
NumPy in TF32 (the emulation the tests use) and in FP32; prints the max absolute difference of
each TF32 result from FP32 at batches of 1, 64 and 1,024 samples (random known keys) and
appends rows to ``gemm_tuning_accuracy.csv`` under ``--out``. Run it twice, with and without
``HPS_GEMM_TUNING=off`` in the environment (plans are made once per process).

Usage:
    python benchmarks/gemm_tuning_accuracy.py --out $OUT
    HPS_GEMM_TUNING=off python benchmarks/gemm_tuning_accuracy.py --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
from pathlib import Path

import numpy as np
from zoo_kernel_profile import random_batch

from hps_core.demo import ZOO_MODELS
from hps_core.infer import RankingSession
from hps_core.triton_repo import InstanceGroup, ServingOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="dlrm_v2,dlrm_mlp")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tuning = os.environ.get("HPS_GEMM_TUNING", "on")
    repo = Path(tempfile.mkdtemp(prefix="gemm_tuning_"))
    options = ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_GPU"),))
    rows = []
    for name in args.models.split(","):
        ZOO_MODELS[name](repo, options)
        ps = repo / name / "ps.json"
        gpu = RankingSession.open(ps, name, device_id=0, precision="tf32")
        emulated = RankingSession.open(ps, name, precision="tf32")
        exact = RankingSession.open(ps, name, precision="fp32")
        rng = np.random.default_rng(43)
        for batch in (1, 64, 1024):
            samples = random_batch(gpu, rng, batch)
            reference = exact.predict(samples).astype(np.float64)
            row = dict(
                model=name, batch=batch, tuning=tuning,
                gpu_tf32=float(np.abs(gpu.predict(samples) - reference).max()),
                numpy_tf32=float(np.abs(emulated.predict(samples) - reference).max()),
            )  # fmt: skip
            rows.append(row)
            print(f"tuning {tuning}: {name} {batch}: |GPU TF32 - FP32| {row['gpu_tf32']:.2e}, "
                  f"|NumPy TF32 - FP32| {row['numpy_tf32']:.2e}", flush=True)  # fmt: skip
    path = args.out / "gemm_tuning_accuracy.csv"
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        if new:
            writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
