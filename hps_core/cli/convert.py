"""``hps convert FORMAT ...``: converters between HugeCTR files and other formats.

Each converter lives in its own module exposing ``register(subparsers)`` for the
``hps convert`` sub-subcommands.
"""

from __future__ import annotations

import argparse
import importlib

_CONVERTER_MODULES = (
    "hps_core.cli.convert_parquet",
    "hps_core.cli.convert_dlrm",
    "hps_core.cli.convert_torchrec",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps convert`` and its converters to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser("convert", help="convert models between formats")
    converters = parser.add_subparsers(dest="format", metavar="FORMAT", required=True)
    for name in _CONVERTER_MODULES:
        importlib.import_module(name).register(converters)
