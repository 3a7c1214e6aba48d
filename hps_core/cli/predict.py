"""``hps predict PS_JSON DATASET --out FILE``: score a Parquet dataset offline."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hps_core.cli.arguments import device_choice, positive_int
from hps_core.errors import OVERWRITE_HINT, ModelFileError
from hps_core.host_memory import keep_freed_memory
from hps_core.offline import InferenceModel, write_predictions


def run(args: argparse.Namespace) -> int:
    """Score the dataset, write the predictions (with the labels) and print the AUC."""
    # Before scoring, which may take long.
    if args.out is not None and "://" in args.out:
        raise ModelFileError(f"--out {args.out}: predictions are written to a local file")
    if args.out is not None and Path(args.out).is_dir():
        raise ModelFileError(f"--out {args.out} is a folder; give the Parquet file to write")
    if args.out is not None and Path(args.out).exists() and not args.overwrite:
        raise ModelFileError(f"{args.out} exists; {OVERWRITE_HINT}")
    started = time.perf_counter()
    keep_freed_memory()  # the process scores batch after batch: they reuse their pages
    device = None if args.device == "cpu" else args.device
    model = InferenceModel.from_ps_json(args.ps_json, args.model, device, args.precision)
    try:
        result = model.predict_dataset(args.dataset, batch_size=args.batch_size, progress=True)
    finally:
        model.close()
    seconds = time.perf_counter() - started
    rows = result.scores.shape[0]
    where = "CPU" if model.session.device_id is None else f"GPU {model.session.device_id}"
    print(f"scored {rows:,} samples on the {where} in {seconds:.1f} s ({rows / seconds:,.0f}/s)")
    if args.out is not None:
        print(f"wrote {write_predictions(args.out, result, args.overwrite)}")
    if result.labels is not None:
        print(f"AUC {result.auc():.6f}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps predict`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "predict",
        help="score a Parquet dataset with a ps.json ranking model (AUC when it has labels)",
    )
    parser.add_argument("ps_json", help="the ps.json")
    parser.add_argument(
        "dataset", help="a Parquet file, a folder of them, or HugeCTR's _file_list.txt"
    )
    parser.add_argument("--model", help="the ps.json model (default: its only one)")
    parser.add_argument("--out", help="write labels and predictions to this Parquet file")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument(
        "--device",
        type=device_choice,
        default="auto",
        help="GPU id, or 'cpu' (default 'auto': GPU 0 when there is one, else the CPU)",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "tf32", "fp16"),
        help="the dense network's (default: fp16 where the ps.json says use_mixed_precision, "
        "else fp32, as served)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        help="samples per batch (default: the model's max_batch_size)",
    )
    parser.set_defaults(func=run)
