"""Entry point of the ``hps`` console script.

Each subcommand lives in its own module under ``hps_core.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the
parsed arguments and returning the exit code. Errors raised on purpose (``HPSError``) are
printed as one line per problem, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from hps_core.errors import HPSError

# Modules that provide subcommands, in the order ``hps --help`` lists them.
_SUBCOMMAND_MODULES = (
    "hps_core.cli.check",
    "hps_core.cli.repo",
    "hps_core.cli.repo_torch",
    "hps_core.cli.serve",
    "hps_core.cli.reload",
    "hps_core.cli.models",
    "hps_core.cli.convert",
    "hps_core.cli.graph",
    "hps_core.cli.prepare",
    "hps_core.cli.predict",
    "hps_core.cli.publish",
    "hps_core.cli.prune",
)


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every available subcommand.

    Returns:
        The ``argparse`` parser of the ``hps`` command.
    """
    parser = argparse.ArgumentParser(
        prog="hps", description="HugeCTR-compatible hierarchical parameter server for Triton."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hps`` command line.

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        The process exit code.
    """
    args = build_parser().parse_args(argv)
    # Progress of long loads and conversions is logged; show it on stderr.
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except HPSError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`hps graph ... | head`): stop quietly, as a shell tool killed
        # by SIGPIPE would, and keep Python's final flush of stdout from raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
