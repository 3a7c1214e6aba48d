"""Write a perf_analyzer ``--input-data`` JSON file of Zipf-skewed hps lookup requests.

Each entry of ``"data"`` is one request: ``KEYS`` holds ``keys_per_table[t]`` keys of each
table t, drawn from a bounded Zipf distribution over that table's rows, and ``NUMKEYS``
holds the counts. Ranks map to keys through ``hps_core.workload.permute_ranks`` with seed
``t`` for table t, so each table's hot keys are spread over it and differ between tables.
perf_analyzer sends the entries round-robin.

Shapes: for a model with ``max_batch_size > 0`` (ours), perf_analyzer compares the
``"shape"`` of each tensor with the model's input dims *without* the batch dimension and
then prepends the batch size given by ``-b`` (default 1). So the file holds ``[N]`` and
``[T]``, and perf_analyzer sends ``[1, N]`` and ``[1, T]``. ``--include-batch-dim`` writes
``[1, N]`` and ``[1, T]`` instead, for a model whose config has ``max_batch_size: 0``.

Usage:
    python client_examples/make_perf_input.py --tables-rows 100000,20000 \\
        --keys-per-table 26,26 --alpha 1.05 --samples 64 --seed 0 --out perf_input.json

Needs NumPy and the ``hps_core`` package of this repository for the key generator: run it with
the checkout's venv, ``.venv/bin/python client_examples/make_perf_input.py`` (``scripts/setup.sh``
creates it), or ``pip install -e .`` into the Python that runs it. Another Python stops with a
message saying so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout; ``scripts/setup.sh`` installs its venv (Python, perf_analyzer) in ``.venv/``."""


def _without_packages(error: ModuleNotFoundError) -> str:
    """The message for a Python that lacks NumPy or ``hps_core``: which Python to use instead.

    A plain ``python`` is the system's, without this checkout's packages; the quick start's
    clients run with the venv's, so the message names it, with the arguments given.

    Args:
        error: the failed import.

    Returns:
        One line for stderr.
    """
    venv_python = _REPO_ROOT / ".venv" / "bin" / "python"
    try:
        shown = str(venv_python.relative_to(Path.cwd()))
    except ValueError:
        shown = str(venv_python)
    script = sys.argv[0] if sys.argv[0].endswith(Path(__file__).name) else __file__
    command = shlex.join([shown, script, *sys.argv[1:]])
    setup = "" if venv_python.exists() else " (bash scripts/setup.sh creates it)"
    return (
        f"error: {Path(__file__).name} needs this checkout's packages, and {sys.executable} "
        f"has no module {error.name!r}: run it with the checkout's venv{setup}: {command}"
    )


try:
    import numpy as np

    from hps_core.workload import uniform_keys, zipf_keys, zipf_top_k_mass
except ModuleNotFoundError as _missing:  # a Python without this checkout's packages
    sys.exit(_without_packages(_missing))

# hps_client_common sits next to this script; make it importable when the script is run
# from elsewhere or loaded by file path.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from hps_client_common import (  # noqa: E402
    DEFAULT_MODEL,
    DEFAULT_TABLE_ROWS,
    KEYS_INPUT,
    NUMKEYS_INPUT,
    ClientInputError,
    parse_int_list,
)

PERF_ANALYZER = "perf_analyzer"


def make_perf_input(
    tables_rows: Sequence[int],
    keys_per_table: Sequence[int],
    alpha: float,
    samples: int,
    seed: int,
    include_batch_dim: bool = False,
) -> dict:
    """Build the perf_analyzer input-data document.

    Args:
        tables_rows: rows of each table; table t's keys lie in ``[0, tables_rows[t])``.
        keys_per_table: keys of each table in one request.
        alpha: Zipf exponent, >= 0; 0 draws keys uniformly.
        samples: number of requests (entries of ``"data"``), >= 1.
        seed: seed of the key draws; the same arguments give the same document.
        include_batch_dim: write shapes ``[1, N]``/``[1, T]`` instead of ``[N]``/``[T]``.

    Returns:
        ``{"data": [{"KEYS": {"content": [...], "shape": [...]}, "NUMKEYS": {...}}, ...]}``.

    Raises:
        ValueError: if an argument is out of range; the message names it.

    Example:
        >>> doc = make_perf_input([100, 50], [2, 3], alpha=1.0, samples=1, seed=0)
        >>> doc["data"][0]["NUMKEYS"]
        {'content': [2, 3], 'shape': [2]}
    """
    if len(tables_rows) != len(keys_per_table):
        raise ValueError(
            f"tables_rows has {len(tables_rows)} tables but keys_per_table has "
            f"{len(keys_per_table)}"
        )
    if not tables_rows:
        raise ValueError("tables_rows: at least one table is needed")
    for name, values in (("tables_rows", tables_rows), ("keys_per_table", keys_per_table)):
        if any(int(v) < 1 for v in values):
            raise ValueError(f"{name} must all be >= 1, got {list(values)}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not math.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
    rng = np.random.default_rng(seed)
    lead = [1] if include_batch_dim else []
    total = int(sum(keys_per_table))
    numkeys = [int(n) for n in keys_per_table]
    data = []
    for _ in range(samples):
        columns = [
            zipf_keys(rng, n, rows, alpha, permutation_seed=table)
            if alpha > 0
            else uniform_keys(rng, n, rows)
            for table, (rows, n) in enumerate(zip(tables_rows, keys_per_table, strict=True))
        ]
        data.append(
            {
                KEYS_INPUT: {"content": np.concatenate(columns).tolist(), "shape": [*lead, total]},
                NUMKEYS_INPUT: {"content": numkeys, "shape": [*lead, len(numkeys)]},
            }
        )
    return {"data": data}


def write_perf_input(document: dict, path: Path) -> None:
    """Write the document with one request per line (readable, diff-friendly).

    Args:
        document: as returned by :func:`make_perf_input`.
        path: the JSON file to write.
    """
    entries = ",\n".join(json.dumps(entry, separators=(",", ":")) for entry in document["data"])
    path.write_text('{"data": [\n' + entries + "\n]}\n", encoding="utf-8")


def find_perf_analyzer(
    executable: str | None = None, repo_root: Path | None = None, cwd: Path | None = None
) -> str:
    """Return a perf_analyzer command that runs from ``cwd`` without an activated venv.

    ``scripts/setup.sh`` installs perf_analyzer into the venv's ``bin/`` only, which is on
    PATH only while the venv is activated; a plain ``perf_analyzer`` would then fail with
    "command not found". Looked for, in order: next to the running interpreter (the venv
    this script runs in; its ``bin/`` is not resolved through symlinks, which would lead to
    the system Python's folder), then ``.venv/bin/`` of the checkout.

    Args:
        executable: the interpreter; ``sys.executable`` when ``None``.
        repo_root: the checkout; the parent of ``client_examples/`` when ``None``.
        cwd: the directory the command will be run from; ``Path.cwd()`` when ``None``.

    Returns:
        The path of the first executable found, relative to ``cwd`` when it lies below it
        (e.g. ``.venv/bin/perf_analyzer``) and absolute otherwise, shell-quoted; plain
        ``perf_analyzer`` (looked up on PATH) when none is found.
    """
    executable = sys.executable if executable is None else executable
    root = _REPO_ROOT if repo_root is None else repo_root
    here = Path.cwd() if cwd is None else cwd
    candidates = [Path(executable).parent / PERF_ANALYZER] if executable else []
    candidates.append(root / ".venv" / "bin" / PERF_ANALYZER)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            path = Path(os.path.abspath(candidate))
            try:
                shown = str(path.relative_to(os.path.abspath(here)))
            except ValueError:
                shown = str(path)
            # A bare name would be looked up on PATH: keep a slash in a relative path.
            return shlex.quote(shown if "/" in shown else f"./{shown}")
    return PERF_ANALYZER


def perf_analyzer_command(out: Path, perf_analyzer: str = PERF_ANALYZER) -> str:
    """Return the perf_analyzer command line that replays ``out`` against the server: the
    README's quick-start load test.

    A fixed number of requests at one concurrency ends in seconds on any machine and exits
    non-zero when a request fails; perf_analyzer's default, windows of 5 s until three agree
    within 10 %, may never settle on a busy 2-core machine.

    Args:
        out: the input-data file.
        perf_analyzer: the program, as :func:`find_perf_analyzer` returns it.

    Returns:
        One shell command line.
    """
    return (
        f"{perf_analyzer} -m {DEFAULT_MODEL} -i grpc -u localhost:8001 "
        f"--input-data {shlex.quote(str(out))} --concurrency-range 2 --request-count 2000"
    )


def _int_list(text: str) -> list[int]:
    try:
        return parse_int_list(text)
    except ClientInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser.

    Returns:
        The parser of ``make_perf_input.py``.
    """
    parser = argparse.ArgumentParser(
        prog="make_perf_input.py",
        description="Write perf_analyzer --input-data JSON for an hps embedding model.",
    )
    parser.add_argument(
        "--tables-rows",
        type=_int_list,
        default=list(DEFAULT_TABLE_ROWS),
        metavar="R0,R1,...",
        help=f"rows per table (default {','.join(map(str, DEFAULT_TABLE_ROWS))})",
    )
    parser.add_argument(
        "--keys-per-table",
        type=_int_list,
        default=[26, 26],
        metavar="N0,N1,...",
        help="keys per table in each request (default 26,26)",
    )
    parser.add_argument(
        "--alpha", type=float, default=1.05, help="Zipf exponent, 0 = uniform (%(default)s)"
    )
    parser.add_argument("--samples", type=int, default=64, help="requests (%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (%(default)s)")
    parser.add_argument(
        "--include-batch-dim",
        action="store_true",
        help="write shapes [1, N] and [1, T] (for a model with max_batch_size: 0)",
    )
    parser.add_argument("--out", type=Path, default=Path("perf_input.json"), help="output file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Write the input-data file and print how to use it.

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        0 on success, 2 for bad arguments or an unwritable output file.
    """
    args = build_parser().parse_args(argv)
    try:
        document = make_perf_input(
            args.tables_rows,
            args.keys_per_table,
            args.alpha,
            args.samples,
            args.seed,
            args.include_batch_dim,
        )
        write_perf_input(document, args.out)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    first = document["data"][0]
    print(
        f"wrote {args.samples} requests to {args.out}: {KEYS_INPUT} shape "
        f"{first[KEYS_INPUT]['shape']}, {NUMKEYS_INPUT} {first[NUMKEYS_INPUT]['content']}"
    )
    for table, rows in enumerate(args.tables_rows):
        cache = max(1, rows // 100)
        print(
            f"table {table}: {rows} rows; an ideal cache of the hottest 1% ({cache} rows) "
            f"would serve {zipf_top_k_mass(rows, args.alpha, cache):.1%} of lookups"
        )
    print(f"use: {perf_analyzer_command(args.out, find_perf_analyzer())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
