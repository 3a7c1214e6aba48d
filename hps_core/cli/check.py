"""``hps check PS_JSON``: validate a HugeCTR ps.json and the files it names."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from hps_core.config import DatabaseType, PSConfig, UpdateSourceType
from hps_core.footprint import ModelFootprint, TableFootprint
from hps_core.model_check import CheckReport, check_connections, check_ps_json
from hps_core.wording import plural


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def tier_mib(n: int) -> str:
    """Bytes of a tier in MiB, two decimals (``--json`` has the exact count).

    Example:
        >>> tier_mib(3 * 2**20), tier_mib(20_000), tier_mib(100)
        ('3.00 MiB', '0.02 MiB', '<0.01 MiB')
    """
    mib = n / 2**20
    return "<0.01 MiB" if 0 < mib < 0.005 else f"{mib:.2f} MiB"


def _outside(tiers: dict[str, int], layouts: dict[str, str] | None = None) -> str:
    """`` | outside this process: Redis cluster X, RocksDB Y`` for the tiers that have them,
    each with the precision of its rows where it is not the table's (``layouts``)."""
    names = {"redis_cluster": "Redis cluster", "rocks_db": "RocksDB"}
    parts = []
    for name, label in names.items():
        if name in tiers:
            layout = (layouts or {}).get(name)
            parts.append(f"{label} {tier_mib(tiers[name])}" + (f" ({layout})" if layout else ""))
    return f" | outside this process: {', '.join(parts)}" if parts else ""


def table_bytes_line(table: TableFootprint) -> str:
    """The ``hps check`` line of one table's tier bytes (per machine, per GPU instance)."""
    gpu = []
    if table.gpu_cache:
        gpu.append(f"cache {tier_mib(table.gpu_cache)} ({plural(table.gpu_cache_rows, 'row')})")
    if table.gpu_static:
        gpu.append(f"static table {tier_mib(table.gpu_static)}")
    if table.gpu_index:
        gpu.append(f"row index {tier_mib(table.gpu_index)}")
    return (
        f"  [{table.index}] {table.name} bytes ({table.precision}): host {tier_mib(table.host)}"
        f" | per GPU instance: {', '.join(gpu) or 'none'}"
        f"{_outside(table.tier_bytes(), _other_layouts(table))}"
    )


def _other_layouts(table: TableFootprint) -> dict[str, str]:
    """Databases whose rows are not in the table's precision (HugeCTR's FP32 layout)."""
    return {
        tier: precision
        for tier, precision in table.outside_precision.items()
        if precision != table.precision
    }


def model_bytes_line(footprint: ModelFootprint) -> str:
    """The ``hps check`` line of a model's total tier bytes, in its tables' precision
    (``mixed`` when they differ)."""
    return (
        f"  total bytes ({footprint.precision}): host {tier_mib(footprint.host)} per machine"
        f" | {tier_mib(footprint.gpu)} per GPU instance, {plural(footprint.gpus, 'GPU')}"
        f"{_outside(footprint.tier_bytes())}"
    )


def print_summary(report: CheckReport, connections: Sequence[str] = ()) -> None:
    """Print models, tables, rows, dims and bytes of a clean report, then the bytes each tier
    will hold (:mod:`hps_core.footprint`).

    Args:
        report: a report without problems.
        connections: a line per server outside this machine's files (answered or not tried).
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
        footprint = model_report.footprint
        assert footprint is not None  # idem
        for table_footprint in footprint.tables:
            print(table_bytes_line(table_footprint))
        print(model_bytes_line(footprint))
        for label, path in (("dense", model.dense_file), ("network", model.network_file)):
            if path is not None:
                print(f"  {label}: {path}")
    for line in connections:
        print(line)
    print(f"ok: {plural(len(report.models), 'model')}, {_mib(total)} of sparse files")


def summary_document(report: CheckReport) -> dict[str, object]:
    """``hps check --json``: the clean report as a JSON-ready document, exact byte counts.

    Args:
        report: a report without problems.
    """
    models = []
    for model_report in report.models:
        model = model_report.model
        footprint = model_report.footprint
        assert footprint is not None
        doc = footprint.to_dict()
        tables = []
        for table, info in zip(footprint.tables, model_report.tables, strict=True):
            assert info is not None
            entry = table.to_dict()
            entry["sparse_file"] = str(info.path)
            entry["sparse_file_bytes"] = info.total_bytes
            tables.append(entry)
        doc["tables"] = tables
        doc["dense_file"] = None if model.dense_file is None else str(model.dense_file)
        doc["network_file"] = None if model.network_file is None else str(model.network_file)
        models.append(doc)
    return {"ok": True, "models": models}


def run(args: argparse.Namespace) -> int:
    """Check the ps.json; print a summary (exit 0) or one line per problem (exit 1), after a
    warning per field set without effect here; with ``--json``, one JSON document on stdout
    that holds all of them, and nothing on stderr."""
    report = check_ps_json(args.ps_json, args.model, keys=True)
    notes: list[str] = []
    if args.connect and report.config is not None:
        problems, notes = check_connections(report.config)
        report.problems += problems
    if args.json:  # one JSON document on stdout, the problems and warnings in it, nothing else
        if report.problems:
            problems = [{"where": p.where, "message": p.message} for p in report.problems]
            doc = {"ok": False, "problems": problems, "warnings": report.warnings}
            print(json.dumps(doc, indent=2))
            return 1
        doc = {**summary_document(report), "warnings": report.warnings, "connections": notes}
        print(json.dumps(doc, indent=2))
        return 0
    for line in report.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if report.problems:
        for problem in report.problems:
            print(problem, file=sys.stderr)
        return 1
    assert report.config is not None  # a clean report parsed its ps.json
    servers = _servers(report.config)
    if servers and not args.connect:
        notes = [f"not contacted: {', '.join(servers)} (--connect tries them)"]
    print_summary(report, [f"servers: {note}" for note in notes])
    return 0


def _servers(config: PSConfig) -> list[str]:
    """The servers outside this machine's files that a ps.json names."""
    servers = []
    if config.volatile_db.type is DatabaseType.REDIS_CLUSTER:
        servers.append(f"Redis cluster at {config.volatile_db.address}")
    if config.update_source.type is UpdateSourceType.KAFKA_MESSAGE_QUEUE:
        servers.append(f"Kafka brokers at {config.update_source.brokers}")
    return servers


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
    parser.add_argument(
        "--connect",
        action="store_true",
        help="also try the Redis cluster (volatile_db) and the Kafka brokers (update_source) "
        "the ps.json names; one that does not answer is a problem",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print only JSON, on stdout: the summary (exact bytes of each tier) and the "
        'warnings; on problems, {"ok": false, "problems": [...], "warnings": [...]}',
    )
    parser.set_defaults(func=run)
