"""``hps repo-torch PS_JSON OUT_DIR --module FILE.py:FACTORY``: the Triton model folder of a
user's PyTorch module whose tables are the ps.json's (:mod:`hps_core.torch_repo`).

Example:
    hps repo-torch out/ps.json model_repository --module dlrm_dcn.py:build \\
        --state-dict model.pt --input dense:fp32:13 --input sparse:int64:26 \\
        --output score:fp32:1 --kind KIND_GPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hps_core.cli.repo import serving_options
from hps_core.config import load_ps_config
from hps_core.errors import ConfigError, HPSError
from hps_core.infer.model_io import TensorSpec

_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32, "int64": np.int64}


def tensor_spec(text: str) -> TensorSpec:
    """``NAME:TYPE:DIMS`` (``dense:fp32:13``, ``ids:int64:26x3``) as a tensor spec.

    Raises:
        argparse.ArgumentTypeError: naming what is wrong.
    """
    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME:TYPE:DIMS (e.g. dense:fp32:13)")
    name, kind, dims = parts
    if kind not in _DTYPES:
        raise argparse.ArgumentTypeError(f"'{text}': TYPE must be one of {', '.join(_DTYPES)}")
    try:
        shape = tuple(int(d) for d in dims.split("x"))
    except ValueError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"'{text}': DIMS are positive integers, e.g. 26 or 26x3")
    return TensorSpec(name, _DTYPES[kind], shape)


def run(args: argparse.Namespace) -> int:
    """Write the model folder; print it and the next command."""
    from hps_core.torch_repo import TorchModelFiles, write_torch_model

    module_file, _, factory = args.module.partition(":")
    files = TorchModelFiles(
        Path(module_file), factory or "build", Path(args.state_dict) if args.state_dict else None
    )
    batch = args.max_batch_size
    if batch is None:  # the ps.json model's: its GPU caches are sized for it
        try:
            batch = load_ps_config(Path(args.ps_json)).model(args.model).max_batch_size
        except HPSError as exc:
            print(exc, file=sys.stderr)
            return 1
    options = serving_options(args, batch)
    outputs = args.output or [tensor_spec("score:fp32:1")]
    try:
        folder = write_torch_model(
            Path(args.out_dir), Path(args.ps_json), args.model, files, args.input, outputs,
            options, args.name,
        )  # fmt: skip
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    except HPSError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"wrote {folder}")
    print(f"serve it with: hps serve --model-repository {args.out_dir}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps repo-torch`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "repo-torch",
        help="write the Triton model folder of a PyTorch module whose tables are a ps.json's",
    )
    parser.add_argument("ps_json", help="the ps.json of the module's tables")
    parser.add_argument("out_dir", help="model repository folder to write into")
    parser.add_argument(
        "--module",
        required=True,
        metavar="FILE.py:FACTORY",
        help="the Python file and its function FACTORY(ps_config_file, model_name) that "
        "returns the torch.nn.Module to serve (FACTORY defaults to build)",
    )
    parser.add_argument("--model", required=True, help="the ps.json model its layers look up")
    parser.add_argument("--name", help="the Triton model's name (default: --model)")
    parser.add_argument(
        "--state-dict",
        metavar="FILE.pt",
        help="the module's trained weights (torch.save of a state dict); TorchRec tables' "
        "weights in it are left out (the ps.json's files hold them)",
    )
    parser.add_argument(
        "--input",
        action="append",
        type=tensor_spec,
        required=True,
        metavar="NAME:TYPE:DIMS",
        help="a keyword argument of forward, per sample (TYPE fp32, fp16, int32 or int64; "
        "DIMS like 13 or 26x3); repeat for each",
    )
    parser.add_argument(
        "--output",
        action="append",
        type=tensor_spec,
        metavar="NAME:TYPE:DIMS",
        help="an output of forward, per sample (default score:fp32:1); repeat for each, in "
        "the order forward returns them",
    )
    parser.add_argument("--instances", type=int, default=1, help="instances per device (default 1)")
    parser.add_argument(
        "--kind",
        default="KIND_CPU",
        choices=("KIND_CPU", "KIND_GPU"),
        help="where instances run (default KIND_CPU)",
    )
    parser.add_argument("--gpus", help="comma-separated GPU ids for KIND_GPU")
    parser.add_argument(
        "--max-batch-size", type=int, default=None,
        help="samples per forward (Triton's dynamic batcher; default the ps.json model's "
        "max_batch_size)",
    )  # fmt: skip
    parser.add_argument(
        "--no-warmup", action="store_true", help="open the tables on the first request"
    )
    parser.add_argument(
        "--private-gpu-caches",
        action="store_true",
        help="give each GPU instance its own copy of the dynamic caches",
    )
    parser.set_defaults(func=run)
