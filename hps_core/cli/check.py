"""``hps check PS_JSON``: validate a HugeCTR ps.json and the files it names."""

from __future__ import annotations

import argparse
import sys

from hps_core.cli.text import plural
from hps_core.model_check import CheckReport, check_ps_json


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def print_summary(report: CheckReport) -> None:
    """Print models, tables, rows, dims and bytes of a clean report.

    Args:
        report: a report without problems.
    """
    total = 0
    for model_report in report.models:
        model = model_report.model
        print(f"model '{model.name}': {plural(len(model.tables), 'table')}")
        for table, info in zip(model.tables, model_report.tables, strict=True):
            assert info is not None  # a clean report inspected every table
            total += info.total_bytes
            print(
                f"  [{table.index}] {table.name}: {info.rows} rows x dim {info.dim}, "
                f"{_mib(info.total_bytes)} ({table.sparse_file})"
            )
        for label, path in (("dense", model.dense_file), ("network", model.network_file)):
            if path is not None:
                print(f"  {label}: {path}")
    print(f"ok: {plural(len(report.models), 'model')}, {_mib(total)} of sparse files")


def run(args: argparse.Namespace) -> int:
    """Check the ps.json; print a summary (exit 0) or one line per problem (exit 1), after a
    warning per field set without effect here."""
    report = check_ps_json(args.ps_json, args.model)
    for line in report.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if report.problems:
        for problem in report.problems:
            print(problem, file=sys.stderr)
        return 1
    print_summary(report)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps check`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "check", help="validate a HugeCTR ps.json and the model files it names"
    )
    parser.add_argument("ps_json", help="path of the ps.json")
    parser.add_argument("--model", help="check only this model")
    parser.set_defaults(func=run)
