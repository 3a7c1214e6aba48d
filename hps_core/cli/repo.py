"""``hps repo PS_JSON OUTDIR``: a Triton model repository serving a ps.json's models.

A model with ``network_file`` and ``dense_file`` becomes a ranking model (two Triton models,
``<model>`` with HugeCTR's ``hugectr`` contract and ``<model>_samples``); any other model an
embedding-lookup model (HugeCTR's ``hps`` contract).

``--version N`` adds version N of every model next to the versions the repository has, with
its own ps.json (naming the new sparse/dense/network files); a running ``hps serve`` switches
to it with ``hps reload MODEL`` while the old version keeps serving until the load returns.

Example:
    hps repo retrained/ps.json model_repository --version 2 && hps reload wdl
"""

from __future__ import annotations

import argparse
import sys

from hps_core.errors import ConfigError, HPSError
from hps_core.model_check import check_ps_json
from hps_core.triton_repo import InstanceGroup, ServingOptions, write_repository


def serving_options(
    args: argparse.Namespace, max_batch_size: int, freeze_sparse: bool = False
) -> ServingOptions:
    """The batching and placement of ``--instances``, ``--kind``, ``--gpus``, ``--no-warmup``
    and ``--private-gpu-caches`` (``hps repo`` and ``hps repo-torch`` take them alike)."""
    gpus = tuple(int(g) for g in args.gpus.split(",")) if args.gpus else ()
    return ServingOptions(
        max_batch_size=max_batch_size,
        instances=(InstanceGroup(args.instances, args.kind, gpus),),
        warmup=not args.no_warmup,
        share_gpu_cache=not args.private_gpu_caches,
        freeze_sparse=freeze_sparse,
    )


def run(args: argparse.Namespace) -> int:
    """Check the ps.json, then write one model folder per model."""
    report = check_ps_json(args.ps_json)
    if report.problems:
        for problem in report.problems:
            print(problem, file=sys.stderr)
        return 1
    options = serving_options(args, args.max_batch_size, freeze_sparse=args.freeze_sparse)
    try:
        folders = write_repository(args.ps_json, args.out_dir, options, version=args.version)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    except HPSError as exc:
        print(exc, file=sys.stderr)
        return 1
    for folder in folders:
        print(f"wrote {folder}" + (f" version {args.version}" if args.version else ""))
    if args.version:
        names = " ".join(folder.name for folder in folders)
        print(f"switch a running hps serve to it with: hps reload {names}")
    else:
        print(f"serve it with: hps serve --model-repository {args.out_dir}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps repo`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "repo", help="write a Triton model repository serving every model of a ps.json"
    )
    parser.add_argument("ps_json", help="path of the HugeCTR ps.json")
    parser.add_argument("out_dir", help="model repository folder to write")
    parser.add_argument("--instances", type=int, default=2, help="instances per device (default 2)")
    parser.add_argument(
        "--kind",
        default="KIND_CPU",
        choices=("KIND_CPU", "KIND_GPU", "KIND_AUTO"),
        help="where instances run (default KIND_CPU)",
    )
    parser.add_argument("--gpus", help="comma-separated GPU ids for KIND_GPU")
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=16,
        help="requests per execute (dynamic batcher; default 16); a _samples model takes the "
        "ps.json max_batch_size samples instead",
    )
    parser.add_argument(
        "--no-warmup", action="store_true", help="load tables on the first request, not at load"
    )
    parser.add_argument(
        "--private-gpu-caches",
        action="store_true",
        help="give each GPU instance its own copy of the dynamic caches instead of sharing "
        "one per GPU",
    )
    parser.add_argument(
        "--version",
        type=int,
        default=None,
        metavar="N",
        help="add version N of each model (its own ps.json in <model>/N/), above the "
        "versions it has; Triton serves the highest version once the model is reloaded. "
        "The model's config.pbtxt keeps its instances, batching and parameters (the options "
        "above apply to new models only)",
    )
    parser.add_argument(
        "--freeze-sparse",
        action="store_true",
        help="HugeCTR's freeze_sparse: later versions keep this version's sparse files, so "
        "a version switch does not re-read the tables (rows from online updates stay)",
    )
    parser.set_defaults(func=run)
