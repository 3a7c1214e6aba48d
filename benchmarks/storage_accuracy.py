"""Accuracy of compressed embedding storage: predictions and AUC of each precision against FP32.

For every ranking model of the demo repository and of ``hps prepare --zoo`` (and any
``--ps-json`` given, e.g. the large DLRMs of ``make_large_dlrm.py``): a labelled Parquet sample
drawn from the FP32 model's own scores (``hps prepare``'s sample: a sample is 1 with the
probability the FP32 model gives it, see :mod:`hps_core.demo.sample_data`), scored offline
(``InferenceModel.predict_dataset``, the ``hps predict`` path) with the tables stored in FP32
and in each ``--storage`` precision (ps.json ``storage_precision``; a table whose compressed
row would not be smaller stays FP32, as ``hps check`` requires). Reports per model and
precision: the largest absolute and relative change of a prediction, the relative L2 change of
all of them, and the AUC against the FP32 AUC on the same labels. Writes
``storage_accuracy.csv`` under ``--out``.

Usage:
    python benchmarks/storage_accuracy.py --out bench_results              # demo + zoo
    python benchmarks/storage_accuracy.py --ps-json /tmp/dlrm/ps.json --no-zoo --out $OUT
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from result_table import write_results

from hps_core.config import load_ps_config
from hps_core.demo import DEMO_MODELS, ZOO_MODELS
from hps_core.demo.sample_data import write_sample_dataset
from hps_core.hps import HPS
from hps_core.offline import InferenceModel, auc
from hps_core.quant import RowFormat
from hps_core.triton_repo import ServingOptions

COLUMNS = ["model", "storage", "samples", "max_abs", "max_rel", "rel_l2", "auc_fp32", "auc",
           "auc_change", "tables_kept_fp32"]  # fmt: skip


def with_storage(ps_json: Path, storage: str) -> tuple[Path, int]:
    """A copy of ``ps_json`` whose tables are stored in ``storage`` where that makes a row
    smaller (the others FP32); returns it and how many tables stay FP32."""
    ps = json.loads(ps_json.read_text())
    model = ps["models"][0]
    dims = model["embedding_vecsize_per_table"]
    per_table = [
        storage if RowFormat(storage, dim).row_bytes < 4 * dim or storage == "fp32" else "fp32"
        for dim in dims
    ]
    model["storage_precision_per_table"] = per_table
    path = ps_json.parent / f"ps_accuracy_{storage}.json"
    path.write_text(json.dumps(ps))
    return path, sum(p != storage for p in per_table)


def score(ps_json: Path, dataset: Path, device: int | None) -> tuple[np.ndarray, np.ndarray]:
    model = InferenceModel.from_ps_json(ps_json, device_id=device)
    try:
        result = model.predict_dataset(dataset)
    finally:
        model.close()
        HPS.close_all()  # each precision builds its own host tier; free the last one
    assert result.labels is not None
    return result.scores[:, 0].astype(np.float64), result.labels[:, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps-json", type=Path, action="append", default=[])
    parser.add_argument("--no-zoo", action="store_true", help="only the --ps-json models")
    parser.add_argument("--storage", default="fp16,int8,fp8")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--device", default="auto", help="GPU id, 'cpu' or 'auto'")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = {"auto": "auto", "cpu": None}.get(args.device, args.device)
    device = int(device) if isinstance(device, str) and device.isdigit() else device
    work = Path(tempfile.mkdtemp(prefix="hps_accuracy_"))
    models: list[tuple[str, str, Path]] = []  # label, model name, ps.json
    if not args.no_zoo:
        writers = {n: w for n, w in DEMO_MODELS.items() if n != "hps_embedding"}
        writers.update(ZOO_MODELS)
        for name, write in writers.items():
            write(work, ServingOptions())
            models.append((name, name, work / name / "ps.json"))
    for ps_json in args.ps_json:  # labelled by folder too: make_large_dlrm names both "dlrm"
        name = load_ps_config(ps_json).models[0].name
        models.append((f"{name}:{ps_json.parent.name}", name, ps_json))
    results = []
    for label, name, ps_json in models:
        base, _ = with_storage(ps_json, "fp32")
        dataset = write_sample_dataset(
            base, name, work / f"{label.replace(':', '_')}.parquet", rows=args.samples, seed=1
        )
        HPS.close_all()
        want, labels = score(base, dataset, device)
        auc_fp32 = auc(labels, want)
        for storage in args.storage.split(","):
            ps, kept = with_storage(ps_json, storage)
            got, _ = score(ps, dataset, device)
            change = np.abs(got - want)
            row = {
                "model": label, "storage": storage, "samples": len(want),
                "max_abs": float(change.max()),
                "max_rel": float((change / np.maximum(np.abs(want), 1e-30)).max()),
                "rel_l2": float(np.linalg.norm(got - want) / np.linalg.norm(want)),
                "auc_fp32": auc_fp32, "auc": auc(labels, got),
                "tables_kept_fp32": kept,
            }  # fmt: skip
            row["auc_change"] = row["auc"] - auc_fp32
            results.append(row)
            print(f"{label:>14} {storage}: max |d| {row['max_abs']:.2e} (rel {row['max_rel']:.2e}),"
                  f" rel L2 {row['rel_l2']:.2e}, AUC {row['auc']:.5f} vs {auc_fp32:.5f} "
                  f"({row['auc_change']:+.5f})" + (f", {kept} table(s) kept FP32" if kept else ""),
                  flush=True)  # fmt: skip
    write_results(args.out / "storage_accuracy.csv", COLUMNS, results, ".3g")


if __name__ == "__main__":
    main()
